"""Training-serving skew: the vectors an InferenceService assembled for
entity requests (its request log) against the offline store's point-in-time
values for the same entities at the same times. One definition of each
feature serves both, so they must match; a difference means the online
store lags (materialisation), or serving and training compute differently.

Rows the offline store cannot answer (a feature older than its view's ttl
at that time, which Feast's file offline store drops) are counted apart:
they have no training-time value to compare with.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kubeloop.requestlog import answered

ROW_ID = "__kubeloop_row"


@dataclass(frozen=True)
class ServedRow:
    """One row an entity request was answered for."""

    version: str
    ts: float
    columns: dict
    """The entity keys and request columns the caller sent."""
    vector: list[float]
    """The vector the model was given."""


def served_rows(records: Iterable[dict], sample: int, seed: int = 0) -> list[ServedRow]:
    """The entity-request rows of request-log records (primary and canary
    answers; mirrored copies and raw-vector requests have none), a random
    sample of at most `sample`."""
    rows = []
    for record in records:
        sent = record.get("request")
        if not sent or not answered(record):
            continue
        for i, vector in enumerate(record["features"]):
            rows.append(ServedRow(str(record["version"]), record["ts"], {k: v[i] for k, v in sent.items()}, vector))
    if len(rows) > sample:
        rows = random.Random(seed).sample(rows, sample)
    return rows


@dataclass
class SkewReport:
    """How the served vectors of one version compare with the offline store."""

    version: str
    columns: list[str]
    compared: int = 0
    not_in_offline: int = 0
    """Rows the offline store had no point-in-time answer for (ttl)."""
    mismatched: int = 0
    max_difference: float = 0.0
    by_column: dict[str, int] = field(default_factory=dict)
    """Column -> rows where it differs."""
    examples: list[str] = field(default_factory=list)

    @property
    def matches(self) -> bool:
        return self.compared > 0 and self.mismatched == 0


def compare(version: str, columns: list[str], rows: list[ServedRow], offline: list[list[float] | None],
            tolerance: float = 1e-5) -> SkewReport:
    """Served against offline vectors, row by row (offline None: no answer).
    Values differ when |served - offline| > tolerance * max(1, |offline|)."""
    report = SkewReport(version, list(columns))
    for row, expected in zip(rows, offline, strict=True):
        if expected is None:
            report.not_in_offline += 1
            continue
        report.compared += 1
        gaps = [abs(s - o) for s, o in zip(row.vector, expected, strict=True)]
        differing = [j for j, gap in enumerate(gaps) if gap > tolerance * max(1.0, abs(expected[j]))]
        report.max_difference = max(report.max_difference, *gaps)
        if not differing:
            continue
        report.mismatched += 1
        for j in differing:
            report.by_column[columns[j]] = report.by_column.get(columns[j], 0) + 1
        if len(report.examples) < 5:
            shown = ", ".join(f"{columns[j]} served {row.vector[j]:.6g} offline {expected[j]:.6g}" for j in differing)
            report.examples.append(f"{row.columns} at {row.ts:.3f}: {shown}")
    return report


def check_skew(records: Iterable[dict], tags_of: Callable[[str], dict[str, str]], sample: int = 200,
               tolerance: float = 1e-5, seed: int = 0) -> list[SkewReport]:
    """Compare a sample of the served rows of each version with the offline
    store that version was trained from (its registered tags name the
    signature and the store)."""
    by_version: dict[str, list[ServedRow]] = {}
    for row in served_rows(records, sample, seed):
        by_version.setdefault(row.version, []).append(row)
    return [_check_version(version, rows, tags_of(version), tolerance) for version, rows in sorted(by_version.items())]


def _check_version(version: str, rows: list[ServedRow], tags: dict[str, str], tolerance: float) -> SkewReport:
    import pandas as pd

    from kubeloop.api.signature import ModelSignature
    from kubeloop.featurestore.store import StoreLocation, feature_view, open_store, point_in_time
    from kubeloop.registry.tags import FEATURE_STORE

    signature = ModelSignature.from_tags(tags)
    if not tags.get(FEATURE_STORE):
        raise ValueError(f"version {version} has no recorded feature store ({FEATURE_STORE}): nothing to compare with")
    store = open_store(StoreLocation.from_json(tags[FEATURE_STORE]))
    entity_df = pd.DataFrame([r.columns for r in rows])
    entity_df["event_timestamp"] = pd.to_datetime([r.ts for r in rows], unit="s", utc=True)
    entity_df[ROW_ID] = range(len(rows))
    frame, _ = point_in_time(store, [feature_view(store, v) for v in signature.feature_views], entity_df)
    answered = frame.set_index(ROW_ID)[signature.feature_columns]
    offline = [answered.loc[i].tolist() if i in answered.index else None for i in range(len(rows))]
    return compare(version, signature.feature_columns, rows, offline, tolerance)
