"""Repeatability suite: the fraud OptimizedModel's measurement (the
example's techniques, budget and SLO) five times in a row on one trained
model. Passes when the same winner comes out at least four times and the
winner's speedup stays within 10% of its median; prints each variant's
p50/p99 at the SLO batch with intervals, run by run."""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

import torch
import yaml
from rich.console import Console
from rich.table import Table

from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.components.optimize import measure_variants
from kubeloop.components.selection import choose
from kubeloop.components.variants import BuildContext
from tests.bench.optimization_suite import REPO, fraud
from tests.bench.repeat import RUNS, SPREAD_LIMIT, Figure, figures_table, repeat


def _spec() -> OptimizedModelSpec:
    wire = yaml.safe_load((REPO / "examples" / "optimizedmodel.yaml").read_text())["spec"]
    wire.pop("promotion", None)
    return OptimizedModelSpec.model_validate({**wire, "source": {"name": "bench", "version": "1"}})


def run(context, console: Console, quick: bool = False) -> dict:
    spec = _spec()
    slo = spec.latency_slo
    with tempfile.TemporaryDirectory() as tmp:
        with console.status("repeatability: data and the fraud model"):
            use = fraud(Path(tmp), quick)
        x, y, x_hold, y_hold = use["data"]

        def once(i: int) -> dict:
            ctx = BuildContext(use["model"], x, y, spec, Path(tmp) / f"run{i}", torch.device("cpu"), seed=0)
            ctx.workdir.mkdir(parents=True)
            with console.status(f"repeatability: run {i + 1}/{RUNS}, {len(spec.techniques)} techniques"):
                started = time.perf_counter()
                rows, _ = measure_variants(ctx, spec.techniques, spec.batch_sizes, use["score"], x_hold, y_hold)
                choice = choose(rows, spec.accuracy_budget, slo, use["metric"])
            return {"seconds": time.perf_counter() - started, "winner": choice.winner.technique,
                    "basis": choice.basis, "why": choice.why, "speedup": choice.winner.speedup,
                    "rows": {r.technique: r for r in choice.rows if not r.error}}

        runs = repeat(once)
    winners = Counter(r["winner"] for r in runs)
    top, count = winners.most_common(1)[0]
    speedup = Figure(f"{top} speedup ({slo.percentile}, batch {slo.batch_size})",
                     [r["speedup"].value for r in runs if r["winner"] == top], "x")
    within = all(abs(v - speedup.median) <= SPREAD_LIMIT * speedup.median for v in speedup.values)
    passed = count >= RUNS - 1 and within
    console.print(_table(runs, slo))
    for i, r in enumerate(runs):
        console.print(f"run {i + 1}: {r['winner']} ({r['basis']}) {r['speedup']}x, {r['seconds']:.0f} s: {r['why']}")
    console.print(figures_table("repeatability: the winner's speedup", [speedup]))
    console.print(f"[bold]{'PASS' if passed else 'FAIL'}[/]: winner {top} in {count}/{RUNS} runs (need {RUNS - 1}); "
                  f"its speedups {', '.join(f'{v:.2f}' for v in speedup.values)} "
                  f"{'all' if within else 'NOT all'} within {SPREAD_LIMIT:.0%} of the median {speedup.median:.2f}")
    return {"passed": passed, "winners": dict(winners), "speedup": speedup.to_json(),
            "runs": [{"winner": r["winner"], "basis": r["basis"], "why": r["why"], "seconds": round(r["seconds"], 1),
                      "speedup": _est(r["speedup"]),
                      "variants": {t: {"p50": _est(m.latency[slo.batch_size][0]), "p99": _est(m.latency[slo.batch_size][1]),
                                       "accepted": m.accepted}
                                   for t, m in r["rows"].items()}} for r in runs]}


def _est(e) -> list[float]:  # noqa: ANN001 - Estimate
    return [round(e.value, 5), round(e.low, 5), round(e.high, 5)]


def _table(runs: list[dict], slo) -> Table:  # noqa: ANN001 - LatencySLO
    table = Table(title=f"fraud OptimizedModel, {RUNS} runs: p50 / p99 ms at batch {slo.batch_size} "
                        "[95% interval] (CPU: thread CPU clock, 1 thread per runtime, interleaved)")
    table.add_column("variant")
    for i in range(len(runs)):
        table.add_column(f"run {i + 1}")
    for technique in runs[0]["rows"]:
        cells = []
        for r in runs:
            m = r["rows"].get(technique)
            if m is None:
                cells.append("-")
                continue
            p50, p99 = m.latency[slo.batch_size]
            mark = " *" if technique == r["winner"] else ("" if m.accepted else " (rejected)")
            cells.append(f"{p50}\n{p99}{mark}")
        table.add_row(technique, *cells)
    return table
