"""Data validation before training: the rows checked against the rules of
spec.validation and against the champion's training data, as plain
functions of data frames (the step that reads and logs is
kubeloop.components.steps.validate_step).

The schema inferred from a training set (types, null shares, ranges,
categories, label shares) is kept with the training run as
validation/data_schema.json; a later job whose champion is that version
compares its rows with it, and compares each feature's distribution with
the champion's training sample by PSI (Evidently's psi test, through
kubeloop.components.distributions). Each finding names the column, the rule
and the values, so that the first few make a condition message a person
can act on.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import pandas as pd

from kubeloop.api.training import ChampionComparison, ColumnRule, DataValidation, ShareRange

SCHEMA = "validation/data_schema.json"
REPORT = "validation/report.json"
MAX_CATEGORIES = 100
"""A non-numeric column with more distinct values is not profiled as categorical."""
SHOWN = 5
"""Findings quoted in a failure message or tag; the report has them all."""
MAX_MESSAGE = 3000


class DataValidationError(ValueError):
    """The training data broke a rule in fail mode: the message names the
    column, the rule and the values of the first findings."""


@dataclass(frozen=True)
class Finding:
    column: str
    rule: str
    """The spec field (maxNullShare, min, max, categories, labelShare) or
    champion comparison field (psiThreshold, ...) that was broken."""
    message: str
    source: str = "spec"
    """spec (a rule of spec.validation) or champion (the comparison)."""
    values: dict = field(default_factory=dict)


@dataclass
class Report:
    """What the step found: logged to the training run as validation/report.json."""

    mode: str
    """fail, warn, or off (no spec.validation: the schema is recorded, nothing checked)."""
    findings: list[Finding] = field(default_factory=list)
    champion: dict | None = None
    """The champion compared with: version, whether it had a schema, PSI per feature."""
    schema: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        """One line: the kubeloop.validation tag, and the failure's message."""
        if self.mode == "off":
            return "not configured"
        if self.passed:
            return "passed"
        return f"{self.mode}: {describe(self.findings)}"

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "passed": self.passed, "summary": self.summary()}, sort_keys=True,
                          default=str)

    @classmethod
    def from_json(cls, text: str) -> "Report":
        data = json.loads(text)
        return cls(mode=data["mode"], findings=[Finding(**f) for f in data["findings"]],
                   champion=data.get("champion"), schema=data.get("schema", {}))


def describe(findings: list[Finding], limit: int = MAX_MESSAGE) -> str:
    """The first findings on one line, bounded."""
    shown = "; ".join(f.message for f in findings[:SHOWN])
    more = f"; and {len(findings) - SHOWN} more (validation/report.json)" if len(findings) > SHOWN else ""
    text = f"{len(findings)} finding{'s' if len(findings) != 1 else ''}: {shown}{more}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def number(value: float) -> str:
    """A value as a message shows it: 3 for 3.0, 4 significant digits otherwise."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"


def category(value) -> str:  # noqa: ANN001 - any cell
    return number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def _numeric(series: pd.Series) -> bool:
    return pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series)


def label_shares(label: pd.Series, task: str) -> dict[str, float]:
    """Binary: the share of positive rows ("1"); multiclass: each class's share."""
    values = label.dropna()
    if task == "regression" or values.empty:
        return {}
    if task == "binary":
        return {"1": float(values.astype(float).mean())}
    counts = values.map(category).value_counts(normalize=True)
    return {str(k): float(v) for k, v in sorted(counts.items())}


def profile(series: pd.Series) -> dict:
    nulls = float(series.isna().mean()) if len(series) else 0.0
    present = series.dropna()
    if _numeric(series):
        return {"kind": "numeric", "null_share": nulls,
                "min": float(present.min()) if len(present) else None,
                "max": float(present.max()) if len(present) else None}
    values = sorted({category(v) for v in present})
    return {"kind": "categorical", "null_share": nulls,
            "categories": values if len(values) <= MAX_CATEGORIES else None}


def infer_schema(frame: pd.DataFrame, columns: list[str], label: str, task: str) -> dict:
    """The schema of a training set: each column's kind, null share, range
    or categories, and the label's shares."""
    return {"rows": len(frame), "label": label, "task": task,
            "columns": {c: profile(frame[c]) for c in dict.fromkeys([*columns, label]) if c in frame.columns},
            "label_shares": label_shares(frame[label], task)}


def check_rule(frame: pd.DataFrame, rule: ColumnRule) -> list[Finding]:
    """One rule of spec.validation.rules on every row."""
    name = rule.column
    if name not in frame.columns:
        return [Finding(name, "column", f"column '{name}': not in the training data (it has "
                                          f"{', '.join(map(str, frame.columns))})")]
    series, out = frame[name], []
    nulls = float(series.isna().mean()) if len(series) else 0.0
    if rule.max_null_share is not None and nulls > rule.max_null_share:
        out.append(Finding(name, "maxNullShare", f"column '{name}': null share {nulls:.3g} is above maxNullShare "
                                                 f"{number(rule.max_null_share)}",
                           values={"null_share": nulls, "max_null_share": rule.max_null_share}))
    present = series.dropna()
    if (rule.min is not None or rule.max is not None) and len(present):
        out += _bounds(name, present, rule)
    if rule.categories is not None and len(present):
        allowed = set(rule.categories)
        text = present.map(category)
        outside = text[~text.isin(allowed)]
        if len(outside):
            seen = sorted(set(outside))[:SHOWN]
            out.append(Finding(name, "categories", f"column '{name}': {len(outside)} of {len(present)} values are "
                                                   f"not among categories [{', '.join(rule.categories)}]: "
                                                   f"{', '.join(seen)}",
                               values={"rows": len(outside), "unexpected": seen}))
    return out


def _bounds(name: str, present: pd.Series, rule: ColumnRule) -> list[Finding]:
    if not _numeric(present):
        return [Finding(name, "min" if rule.min is not None else "max",
                        f"column '{name}': min and max need a numeric column; it holds {present.dtype}")]
    low = rule.min if rule.min is not None else -math.inf
    high = rule.max if rule.max is not None else math.inf
    outside = present[(present < low) | (present > high)]
    if not len(outside):
        return []
    which = "min" if rule.min is not None and (present < low).any() else "max"
    bounds = f"[{number(rule.min) if rule.min is not None else '-inf'}, " \
             f"{number(rule.max) if rule.max is not None else 'inf'}]"
    return [Finding(name, which, f"column '{name}': {len(outside)} of {len(present)} values "
                                 f"({len(outside) / len(present):.1%}) are outside {bounds} (seen "
                                 f"{number(present.min())} to {number(present.max())})",
                    values={"rows": len(outside), "min": float(present.min()), "max": float(present.max())})]


def check_label_share(label: pd.Series, task: str, bounds: ShareRange) -> list[Finding]:
    """spec.validation.labelShare: binary, the positives' share; multiclass, each class's."""
    out = []
    for value, share in label_shares(label, task).items():
        what = "positive share" if task == "binary" else f"share of class {value}"
        if bounds.min is not None and share < bounds.min:
            out.append(Finding(label.name, "labelShare.min", f"label '{label.name}': {what} {share:.3g} is below "
                                                             f"labelShare.min {number(bounds.min)}",
                               values={"class": value, "share": share}))
        if bounds.max is not None and share > bounds.max:
            out.append(Finding(label.name, "labelShare.max", f"label '{label.name}': {what} {share:.3g} is above "
                                                             f"labelShare.max {number(bounds.max)}",
                               values={"class": value, "share": share}))
    return out


def check_spec(frame: pd.DataFrame, label: str, task: str, validation: DataValidation) -> list[Finding]:
    """Every rule of spec.validation on the rows."""
    out = [f for rule in validation.rules for f in check_rule(frame, rule)]
    if validation.label_share is not None:
        out += check_label_share(frame[label], task, validation.label_share)
    return out


def compare_schemas(current: dict, champion: dict, limits: ChampionComparison, version: str) -> list[Finding]:
    """The new training set's schema against the champion's: null shares
    that rose, categories it never saw, label shares that moved (values out
    of range need the rows: see out_of_range)."""
    out = []
    ours = f"the champion's (version {version})"
    for name, now in current["columns"].items():
        before = champion["columns"].get(name)
        if before is None:
            continue
        rise = now["null_share"] - before["null_share"]
        if rise > limits.max_null_share_increase:
            out.append(Finding(name, "maxNullShareIncrease", f"column '{name}': null share {now['null_share']:.3g} is "
                                                             f"{rise:.3g} above {ours} {before['null_share']:.3g} "
                                                             f"(maxNullShareIncrease "
                                                             f"{number(limits.max_null_share_increase)})",
                               "champion", {"null_share": now["null_share"], "champion": before["null_share"]}))
    for value in sorted(set(current["label_shares"]) | set(champion.get("label_shares", {}))):
        now, before = current["label_shares"].get(value, 0.0), champion.get("label_shares", {}).get(value, 0.0)
        if abs(now - before) > limits.max_label_share_shift:
            what = "positive share" if current["task"] == "binary" else f"share of class {value}"
            out.append(Finding(current["label"], "maxLabelShareShift",
                               f"label '{current['label']}': {what} {now:.3g} moved from {ours} {before:.3g} by more "
                               f"than maxLabelShareShift {number(limits.max_label_share_shift)}",
                               "champion", {"class": value, "share": now, "champion": before}))
    return out


def out_of_range(frame: pd.DataFrame, champion: dict, limits: ChampionComparison, version: str) -> list[Finding]:
    """Numeric values outside the champion's range (widened by
    rangeTolerance), and categorical values it never saw."""
    out = []
    for name, before in champion["columns"].items():
        if name not in frame.columns or name == champion.get("label"):
            continue
        present = frame[name].dropna()
        if not len(present):
            continue
        if before["kind"] == "numeric" and before.get("min") is not None and _numeric(present):
            out += _range_finding(name, present, before, limits, version)
        elif before["kind"] == "categorical" and before.get("categories") is not None:
            text = present.map(category)
            unseen = text[~text.isin(set(before["categories"]))]
            share = len(unseen) / len(present)
            if share > limits.max_unseen_category_share:
                seen = sorted(set(unseen))[:SHOWN]
                out.append(Finding(name, "maxUnseenCategoryShare",
                                   f"column '{name}': {share:.1%} of values are categories the champion (version "
                                   f"{version}) never saw: {', '.join(seen)} (maxUnseenCategoryShare "
                                   f"{number(limits.max_unseen_category_share)})",
                                   "champion", {"share": share, "unseen": seen}))
    return out


def _range_finding(name: str, present: pd.Series, before: dict, limits: ChampionComparison,
                   version: str) -> list[Finding]:
    low, high = before["min"], before["max"]
    width = (high - low) or max(abs(low), 1.0)
    lo, hi = low - limits.range_tolerance * width, high + limits.range_tolerance * width
    share = float(((present < lo) | (present > hi)).mean())
    if share <= limits.max_out_of_range_share:
        return []
    return [Finding(name, "maxOutOfRangeShare",
                    f"column '{name}': {share:.1%} of values are outside the champion's (version {version}) range "
                    f"[{number(low)}, {number(high)}] widened by rangeTolerance {number(limits.range_tolerance)} "
                    f"(seen {number(present.min())} to {number(present.max())}; maxOutOfRangeShare "
                    f"{number(limits.max_out_of_range_share)})",
                    "champion", {"share": share, "min": float(present.min()), "max": float(present.max()),
                                 "champion_min": low, "champion_max": high})]


def psi_findings(scores: dict[str, float], threshold: float, version: str) -> list[Finding]:
    """Features whose PSI against the champion's training sample is above the threshold."""
    return [Finding(name, "psiThreshold", f"column '{name}': PSI {score:.3g} against the champion's (version "
                                          f"{version}) training data is above psiThreshold {number(threshold)}",
                    "champion", {"psi": score})
            for name, score in sorted(scores.items()) if score >= threshold]
