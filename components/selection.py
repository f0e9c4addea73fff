"""Accept or reject each measured variant against the accuracy budget, and
choose the winner by the latency SLO (pure).

A budget of 0 means "the source's predictions, only faster": it accepts the
variants whose outputs match the source's (graph compilers, exact
conversions), not a lossy variant that happens to score as well on this
hold-out. Any other budget compares the metric.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kubeloop.api.optimization import AccuracyBudget, LatencySLO
from kubeloop.api.tasks import improvement

LOSSLESS = 1e-4
"""Probabilities closer than this to the source's count as the same model."""


@dataclass(frozen=True)
class Measured:
    technique: str
    runtime: str
    latency: dict[int, tuple[float, float]] = field(default_factory=dict)
    """batch size -> (p50 ms, p99 ms)."""
    metric: float | None = None
    size_mb: float | None = None
    servable: bool = False
    note: str = ""
    error: str | None = None
    """Why the variant could not be built."""
    peak_memory_mib: float | None = None
    divergence: float | None = None
    """Largest difference from the source's probabilities on the hold-out."""
    accepted: bool = False
    reason: str = ""
    speedup: float | None = None
    accuracy_delta: float | None = None

    def at(self, slo: LatencySLO) -> float | None:
        row = self.latency.get(slo.batch_size)
        return None if row is None else row[0 if slo.percentile == "p50" else 1]


@dataclass(frozen=True)
class Choice:
    rows: list[Measured]
    winner: Measured
    meets_slo: bool


def choose(rows: list[Measured], budget: AccuracyBudget, slo: LatencySLO, metric: str) -> Choice:
    """Judge every row against the budget on metric (in its own direction:
    a rise in RMSE or log loss is a loss) and pick the winner by the SLO."""
    source = next(r for r in rows if r.technique == "source")
    base = source.at(slo)
    judged = []
    for row in rows:
        if row.error:
            judged.append(replace(row, accepted=False, reason=f"not built: {row.error}"))
            continue
        delta = row.metric - source.metric
        speedup = base / row.at(slo) if base and row.at(slo) else None
        drop = -improvement(metric, row.metric, source.metric)
        lossless = row.divergence is not None and row.divergence <= LOSSLESS
        if budget.max_drop == 0 and not lossless:
            reason = (f"changes the predictions (max |dp| {row.divergence:.2g}) and the budget is 0"
                      if row.divergence is not None else "the budget is 0")
            judged.append(replace(row, accepted=False, reason=reason, speedup=speedup, accuracy_delta=delta))
        elif drop > budget.max_drop:
            reason = f"{metric} worsens by {drop:.4f}, over the budget of {budget.max_drop}"
            judged.append(replace(row, accepted=False, reason=reason, speedup=speedup, accuracy_delta=delta))
        else:
            judged.append(replace(row, accepted=True, reason="", speedup=speedup, accuracy_delta=delta))
    candidates = [r for r in judged if r.accepted and r.servable]
    winner = min(candidates, key=lambda r: (r.at(slo), r.size_mb or 0.0)) if candidates else None
    if winner is None:  # the source itself is always accepted; only its form may be missing
        winner = next(r for r in judged if r.technique == "source")
    final = []
    for row in judged:
        if row.accepted and not row.servable:
            row = replace(row, reason="accepted, but it has no ONNX form for Triton to serve")
        elif row.accepted and row is not winner:
            slower = (row.at(slo) or 0) / (winner.at(slo) or 1)
            row = replace(row, reason=f"accepted; {slower:.2f}x the winner's latency")
        elif row is winner:
            row = replace(row, reason="winner")
        final.append(row)
    chosen = next(r for r in final if r.reason == "winner")
    return Choice(final, chosen, meets_slo=(chosen.at(slo) or float("inf")) <= slo.milliseconds)
