"""`kubeloop promote`, `kubeloop rollback`, `kubeloop audit`: move registry
aliases by hand, with the same audit trail as the operator's promotions."""

from __future__ import annotations

import getpass
import socket
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

TrackingUri = Annotated[str, typer.Option(envvar="MLFLOW_TRACKING_URI", help="The MLflow server.")]
console = Console()


def _registry(tracking_uri: str):  # noqa: ANN202 - MlflowRegistry
    from kubeloop.registry.mlflow import MlflowRegistry, fail_fast

    fail_fast()
    return MlflowRegistry(tracking_uri)


def _who() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()} (kubeloop CLI)"


def promote(
    model: Annotated[str, typer.Argument(help="Registered model name.")],
    version: Annotated[str, typer.Argument(help="Version to promote.")],
    to: Annotated[str, typer.Option("--to", help="Alias (champion, challenger, ...) or a legacy stage "
                                    "(Production, Staging, Archived).")] = "champion",
    reason: Annotated[str, typer.Option(help="Why, for the audit trail.")] = "manual promotion",
    not_worse: Annotated[bool, typer.Option("--not-worse/--no-not-worse", help=(
        "Refuse unless the version scored at least as well as the current holder of the alias on the "
        "same evaluation set."))] = True,
    tracking_uri: TrackingUri = "",
) -> None:
    """Point an alias at a version (a stage name is mapped onto its alias)."""
    from kubeloop.api.promotion import PromotionGates, alias_for
    from kubeloop.registry.promotion import check_gates, promote as move

    registry = _registry(tracking_uri)
    candidate = registry.get_version(model, version)
    if candidate is None:
        console.print(f"[red]{model} has no version {version}[/red]")
        raise typer.Exit(1)
    verdict = check_gates(PromotionGates(not_worse_than_champion=not_worse), candidate,
                          registry.get_alias(model, alias_for(to)))
    if not verdict.passed:
        console.print(f"[red]not promoted:[/red] {verdict.summary()} (use --no-not-worse to override)")
        raise typer.Exit(1)
    entry = move(registry, model, version, to, by=_who(), reason=reason, verdict=verdict)
    console.print(f"{model}: {entry.alias} {entry.previous or '-'} -> {entry.version}")


def rollback(
    model: Annotated[str, typer.Argument(help="Registered model name.")],
    alias: Annotated[str, typer.Option(help="The alias to move back.")] = "champion",
    reason: Annotated[str, typer.Option(help="Why, for the audit trail.")] = "manual rollback",
    tracking_uri: TrackingUri = "",
) -> None:
    """Point an alias back at the version it held before its last promotion."""
    from kubeloop.registry.promotion import rollback as move_back

    try:
        entry = move_back(_registry(tracking_uri), model, alias, by=_who(), reason=reason)
    except LookupError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None
    console.print(f"{model}: {entry.alias} {entry.previous} -> {entry.version}")


def audit(model: Annotated[str, typer.Argument(help="Registered model name.")],
          tracking_uri: TrackingUri = "") -> None:
    """Show who promoted or rolled back what, when, why, and the gate results."""
    from kubeloop.registry.promotion import audit_trail

    table = Table("at", "action", "alias", "from", "to", "by", "why", "gates")
    for e in audit_trail(_registry(tracking_uri), model):
        table.add_row(e.at, e.action, e.alias, e.previous or "-", e.version, e.by, e.reason, e.gates)
    console.print(table)
