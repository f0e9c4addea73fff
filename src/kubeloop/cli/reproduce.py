"""`kubeloop reproduce MODEL VERSION`: rebuild a registered version from its
lineage as a new MLflow run (never registered nor promoted) and say whether
it reproduces: a trained version trained again, an optimised one's variant
built again from its source. Exit 0: reproduced; 1: it differs; 2: it cannot
be rebuilt (unknown version, no lineage)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from kubeloop.cli.registry import TrackingUri

console = Console()


def reproduce(
    model: Annotated[str, typer.Argument(help="Registered model name.")],
    version: Annotated[str, typer.Argument(help="The version to rebuild.")],
    feast_repo: Annotated[str, typer.Option(envvar="KUBELOOP_FEAST_REPO", help=(
        "The Feast repository to read when the version names no feature store (a version's own store wins)."))] = "",
    tolerance: Annotated[float, typer.Option(help="|Δ| allowed on each checked metric.")] = 0.01,
    output_tolerance: Annotated[float, typer.Option(help=(
        "Mean |Δ| allowed between the two models' outputs on the evaluation rows (probability; regression: "
        "standard deviations of the registered outputs)."))] = 0.01,
    metric: Annotated[Optional[list[str]], typer.Option(help=(  # noqa: UP045 - typer needs Optional
        "A metric the verdict checks (repeatable); default the task's primary metric (auc, macro_f1, rmse), or an "
        "optimised version's accuracy budget metric."))] = None,
    work_dir: Annotated[Optional[Path], typer.Option(help="Keep the rebuilt data and model here.")] = None,  # noqa: UP045
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    tracking_uri: TrackingUri = "",
) -> None:
    """Rebuild a version from its lineage (code, store, views, window, seed, hyper-parameters; for an optimised
    version, its source and the technique the optimiser chose) and compare its dataset hash, metrics and outputs
    with the record."""
    from kubeloop.components.comparison import Tolerance
    from kubeloop.components.reproduce import LineageError, reproduce as rebuild
    from kubeloop.registry.mlflow import fail_fast

    fail_fast()
    try:
        # What the libraries print on the way (MLflow's "View run ... at" line)
        # goes to stderr: stdout holds the report alone, so --json parses.
        with contextlib.redirect_stdout(sys.stderr):
            report = rebuild(tracking_uri, model, version, feast_repo, work_dir,
                             Tolerance(tuple(metric or ()), tolerance, output_tolerance))
    except (LookupError, LineageError) as exc:
        console.print(f"[red]cannot reproduce:[/red] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True))
    else:
        show(report)
    raise typer.Exit(0 if report.reproduced else 1)


def show(report) -> None:  # noqa: ANN001 - components.comparison.Report
    table = Table("", "recorded", "rebuilt", "", title=f"{report.model} version {report.version}: rebuilt as run "
                  f"{report.run_id}")
    for row in [report.dataset, report.rows]:
        table.add_row(row.name, row.recorded, row.now, "[red]differs[/red]" if row.changed else "same")
    for label, rows in (("view definition", report.views), ("view values", report.view_data), ("", report.code)):
        for row in rows:
            table.add_row(f"{label} {row.name}".strip(), row.recorded, row.now,
                          "[yellow]changed[/yellow]" if row.changed else "same")
    tol = report.tolerance
    for m in report.metrics:
        judged = ("[green]within[/green]" if m.within else "[red]outside[/red]") if m.checked else "shown"
        delta = f"|Δ| {m.delta:.4f}" if m.delta is not None else "-"
        table.add_row(f"metric {m.name}", _num(m.recorded), _num(m.rebuilt),
                      f"{delta} {judged}" + (f" (≤ {tol.metric})" if m.checked else ""))
    out = report.outputs
    table.add_row(f"outputs ({out.rows} rows)", "registered", "rebuilt",
                  f"max |Δ| {out.max_abs:.4g}, mean {out.mean_abs:.4g} (≤ {tol.output}, {out.unit})")
    console.print(table)
    for note in report.notes:
        console.print(f"note: {note}")
    colour = "green" if report.reproduced else "red"
    console.print(f"[{colour}]{report.verdict}[/{colour}]")
    if report.reproduced and report.causes:
        console.print(f"changed since, without changing the result: {'; '.join(report.causes)}")


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.6f}"
