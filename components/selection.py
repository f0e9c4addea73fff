"""Accept or reject each measured variant against the accuracy budget, and
choose the winner by the latency SLO (pure).

A budget of 0 means "the source's predictions, only faster": it accepts the
variants whose outputs match the source's (graph compilers, exact
conversions), not a lossy variant that happens to score as well on this
hold-out. Any other budget compares the metric.

A variant wins only when the data supports it: its latency interval at the
SLO lies below the source's and the runner-up's. Where intervals overlap the
measurement cannot tell the variants apart, so the one that changes the
predictions least (then the smaller artifact) is chosen, and the choice says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from kubeloop.api.conditions import Reason
from kubeloop.api.optimization import AccuracyBudget, LatencySLO
from kubeloop.api.tasks import improvement
from kubeloop.components.intervals import Estimate, ratio

LOSSLESS = 1e-4
"""Probabilities closer than this to the source's count as the same model."""
# Reasons of the VariantChosen condition, as the catalogue names them.
FASTER = Reason.MEASURABLY_FASTER
OVERLAP = Reason.INTERVALS_OVERLAP
NOT_FASTER = Reason.NO_VARIANT_MEASURABLY_FASTER


@dataclass(frozen=True)
class Measured:
    technique: str
    runtime: str
    latency: dict[int, tuple[Estimate, Estimate]] = field(default_factory=dict)
    """batch size -> (p50 ms, p99 ms), each with its interval."""
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
    speedup: Estimate | None = None
    accuracy_delta: float | None = None

    def at(self, slo: LatencySLO) -> Estimate | None:
        row = self.latency.get(slo.batch_size)
        return None if row is None else row[0 if slo.percentile == "p50" else 1]

    @property
    def profile(self) -> dict[int, tuple[float, float]]:
        """batch size -> (p50 ms, p99 ms), the point figures."""
        return {b: (p50.value, p99.value) for b, (p50, p99) in self.latency.items()}

    @property
    def changes(self) -> float:
        """How far its predictions move from the source's (0 within LOSSLESS)."""
        if self.divergence is None:
            return float("inf")
        return 0.0 if self.divergence <= LOSSLESS else self.divergence


@dataclass(frozen=True)
class Choice:
    rows: list[Measured]
    winner: Measured
    meets_slo: bool
    basis: str
    """Why the winner won: FASTER, OVERLAP or NOT_FASTER."""
    why: str
    """The same, in words, with the intervals."""


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
        speedup = ratio(base, row.at(slo)) if base and row.at(slo) else None
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
    winner, basis, why = _pick([r for r in judged if r.accepted and r.servable],
                               next(r for r in judged if r.technique == "source"), slo)
    final = []
    for row in judged:
        if row.accepted and not row.servable:
            row = replace(row, reason="accepted, but it has no ONNX form for Triton to serve")
        elif row.accepted and row is not winner:
            slower = row.at(slo).value / winner.at(slo).value
            row = replace(row, reason=f"accepted; {slower:.2f}x the winner's latency")
        elif row is winner:
            row = replace(row, reason="winner")
        final.append(row)
    chosen = next(r for r in final if r.reason == "winner")
    return Choice(final, chosen, chosen.at(slo).value <= slo.milliseconds, basis, why)


def _pick(candidates: list[Measured], source: Measured, slo: LatencySLO) -> tuple[Measured, str, str]:
    """The winner among accepted, servable rows, the basis and the words."""
    where = f"{slo.percentile} at batch {slo.batch_size}"
    base = source.at(slo)
    ranked = sorted(candidates, key=lambda r: r.at(slo).value)
    others = [r for r in ranked if r is not source]
    if not others:  # the source itself is always accepted
        return source, NOT_FASTER, "no other variant is accepted and servable; the source is kept"
    fastest = ranked[0]
    if fastest is source:
        return source, NOT_FASTER, f"the source's {where} {base} ms is the lowest; the source is kept"
    if fastest.at(slo).overlaps(base):
        return source, NOT_FASTER, (f"no variant's {where} interval lies below the source's: the fastest, "
                                    f"{fastest.technique} {fastest.at(slo)} ms, overlaps the source's {base} ms; "
                                    "the source is kept")
    tied = [r for r in ranked if r.at(slo).beats(base) and r.at(slo).overlaps(fastest.at(slo))]
    if len(tied) == 1:
        runner = next(iter(ranked[1:]), None)
        over = (f" and the runner-up {runner.technique}'s {runner.at(slo)} ms"
                if runner is not None and runner is not source else "")
        return fastest, FASTER, f"{fastest.technique}: {where} {fastest.at(slo)} ms lies below the source's {base} ms{over}"
    winner = min(tied, key=lambda r: (r.changes, r.size_mb or 0.0))
    rule = ("it changes the predictions least" if all(winner.changes < r.changes for r in tied if r is not winner)
            else "it changes the predictions no more than the others and is the smallest artifact")
    listed = "; ".join(f"{r.technique} {r.at(slo)} ms" for r in tied)
    return winner, OVERLAP, (f"{where} intervals overlap ({listed}), all below the source's {base} ms; "
                             f"chose {winner.technique}: {rule} (max |dp| {winner.divergence:.2g}, "
                             f"{winner.size_mb} MB)")
