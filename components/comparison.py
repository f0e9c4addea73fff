"""Whether a rebuilt version reproduces the registered one: what each build
says about itself in, a verdict and its reasons out (what `kubeloop
reproduce` prints). Plain data only, no I/O.

A version reproduces when the rebuilt data set has the recorded hash, the
checked metrics are within the metric tolerance of the recorded ones, and
the two models' outputs on the same evaluation rows are within the output
tolerance on average. A changed feature view (definition or values), code or
environment is named whether or not the numbers still agree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

METRIC_TOLERANCE = 0.01
"""|Δ| allowed on each checked metric (auc by default): a reseeded CPU run
of the example lands well inside it, a model trained on other rows does not."""
OUTPUT_TOLERANCE = 0.01
"""Mean |Δ| allowed between the two models' outputs: in probability for
classifiers, in standard deviations of the registered outputs for regression."""
NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Build:
    """What one build of a version says about itself: as recorded at
    registration, or as rebuilt now."""

    dataset_hash: str
    rows: int | None
    views: dict[str, str]
    """Feature view -> fingerprint of its definition."""
    view_data: dict[str, str]
    """Feature view (and "(labels)") -> content hash of the values it gave the rows."""
    code: dict[str, str]
    """What ran: git sha, factory and its code, package versions, device."""
    metrics: dict[str, float]


@dataclass(frozen=True)
class OutputGap:
    """How far the rebuilt model's outputs are from the registered one's on the same rows."""

    rows: int
    max_abs: float
    mean_abs: float
    unit: str


def output_gap(registered: np.ndarray, rebuilt: np.ndarray, task: str) -> OutputGap:
    """Probabilities compare as they are; regression values in units of the
    registered outputs' spread, so the tolerance does not depend on the label's scale."""
    gap = np.abs(np.asarray(rebuilt, np.float64) - np.asarray(registered, np.float64))
    if task == "regression":
        gap = gap / max(float(np.std(registered)), 1e-12)
    unit = "std of the registered outputs" if task == "regression" else "probability"
    return OutputGap(len(registered), float(gap.max(initial=0.0)), float(gap.mean()) if gap.size else 0.0, unit)


@dataclass(frozen=True)
class Tolerance:
    checked: tuple[str, ...]
    """The metrics the verdict holds to the tolerance (all are shown); the
    rebuild fills in the task's primary metric when empty."""
    metric: float = METRIC_TOLERANCE
    output: float = OUTPUT_TOLERANCE


@dataclass(frozen=True)
class Row:
    """One line of a section: what, recorded, now, and whether it changed."""

    name: str
    recorded: str
    now: str
    changed: bool


@dataclass(frozen=True)
class MetricRow:
    name: str
    recorded: float | None
    rebuilt: float | None
    delta: float | None
    checked: bool
    within: bool


@dataclass
class Report:
    model: str
    version: str
    run_id: str
    """The MLflow run of the rebuild (tagged kubeloop.reproduces, never registered)."""
    dataset: Row
    rows: Row
    views: list[Row]
    view_data: list[Row]
    code: list[Row]
    metrics: list[MetricRow]
    outputs: OutputGap
    tolerance: Tolerance
    failures: list[str] = field(default_factory=list)
    causes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def reproduced(self) -> bool:
        return not self.failures

    @property
    def verdict(self) -> str:
        if self.reproduced:
            return "reproduced"
        because = f" (changed since: {'; '.join(self.causes)})" if self.causes else ""
        return f"differs: {'; '.join(self.failures)}{because}"

    def to_dict(self) -> dict:
        return {**asdict(self), "reproduced": self.reproduced, "verdict": self.verdict}


def _rows(recorded: dict[str, str], now: dict[str, str]) -> list[Row]:
    """Every key of either side; a key the version never recorded is shown
    but counts as no change (nothing to compare it with)."""
    rows = []
    for name in sorted({*recorded, *now}):
        before, after = recorded.get(name, NOT_RECORDED), now.get(name, "absent")
        rows.append(Row(name, before, after, name in recorded and before != after))
    return rows


def _metric_rows(recorded: dict[str, float], rebuilt: dict[str, float], tolerance: Tolerance) -> list[MetricRow]:
    rows = []
    for name in sorted({*recorded, *tolerance.checked}):
        before, after = recorded.get(name), rebuilt.get(name)
        delta = abs(after - before) if before is not None and after is not None else None
        checked = name in tolerance.checked
        # The slack absorbs binary floating point (0.91 - 0.9 > 0.01), far below the 6 decimals recorded.
        within = delta is not None and delta <= tolerance.metric + 1e-9
        rows.append(MetricRow(name, before, after, delta, checked, within))
    return rows


def _failures(dataset: Row, metrics: list[MetricRow], outputs: OutputGap, tolerance: Tolerance) -> list[str]:
    out = [f"dataset hash {dataset.now} is not the recorded {dataset.recorded}"] if dataset.changed else []
    for m in metrics:
        if m.checked and m.delta is None:
            out.append(f"{m.name}: no value to compare ({'recorded' if m.recorded is None else 'rebuilt'} lacks it)")
        elif m.checked and not m.within:
            out.append(f"{m.name} |Δ| {m.delta:.4f} > {tolerance.metric}")
    if outputs.mean_abs > tolerance.output:
        out.append(f"outputs mean |Δ| {outputs.mean_abs:.4g} > {tolerance.output} ({outputs.unit})")
    return out


def _causes(dataset: Row, views: list[Row], view_data: list[Row], code: list[Row]) -> list[str]:
    out = [f"feature view {r.name}: definition {r.recorded} -> {r.now}" for r in views if r.changed]
    out += [f"{'the label rows' if r.name.startswith('(') else 'feature view ' + r.name}: values changed"
            for r in view_data if r.changed]
    if dataset.changed and not any(r.changed for r in [*views, *view_data]):
        recorded_any = any(r.recorded != NOT_RECORDED for r in view_data)
        out.append("the rows changed but no view is named: " + (
            "every view's values and definition are as recorded (the label rows or the window?)" if recorded_any
            else "the version recorded no per-view hashes (registered by an older kubeloop)"))
    out += [f"{r.name}: {r.recorded} -> {r.now}" for r in code if r.changed]
    return out


def compare(model: str, version: str, run_id: str, recorded: Build, rebuilt: Build, outputs: OutputGap,
            tolerance: Tolerance, notes: list[str] | None = None) -> Report:
    """The report of one reproduction: each section recorded vs now, what
    fails the verdict, and what changed since the version was registered."""
    dataset = Row("dataset hash", recorded.dataset_hash, rebuilt.dataset_hash,
                  recorded.dataset_hash != rebuilt.dataset_hash)
    rows = Row("rows", str(recorded.rows) if recorded.rows is not None else NOT_RECORDED, str(rebuilt.rows),
               recorded.rows is not None and recorded.rows != rebuilt.rows)
    views, view_data = _rows(recorded.views, rebuilt.views), _rows(recorded.view_data, rebuilt.view_data)
    code = _rows(recorded.code, rebuilt.code)
    metrics = _metric_rows(recorded.metrics, rebuilt.metrics, tolerance)
    return Report(model, version, run_id, dataset, rows, views, view_data, code, metrics, outputs, tolerance,
                  _failures(dataset, metrics, outputs, tolerance), _causes(dataset, views, view_data, code),
                  list(notes or []))
