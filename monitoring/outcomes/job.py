"""The outcome job of one InferenceService: the labels that arrived, joined
to the predictions the front logged over the window; each served version's
live metric with its 95% interval against the metric it was trained to;
and, during a rollout, the per-request losses of the challenger and of the
champion on the same labelled requests (the rollout's sequential test).
Writes latest.json (what the operator's /metrics and reconciler read) and
logs a JSON report to MLflow beside the drift reports.

    python -m kubeloop.monitoring.outcomes.job <folder> [--summary PATH]

The job comes from <folder>/job.json, else $KUBELOOP_OUTCOME_JOB (a Job's
Pod on a cluster), as kubeloop.monitoring.job's does.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kubeloop.components.intervals import Estimate
from kubeloop.files import write_atomic
from kubeloop.monitoring.job import run_job
from kubeloop.monitoring.outcomes.join import LabelSpec, join_labels, prediction_batches, read_labels
from kubeloop.monitoring.outcomes.quality import LiveQuality, drop, live_quality
from kubeloop.monitoring.outcomes.sequential import Stream

ENV = "KUBELOOP_OUTCOME_JOB"
EPSILON = 1e-7


@dataclass(frozen=True)
class OutcomeJob:
    service: str
    model: str
    task: str
    metric: str
    request_log: str
    labels: str
    """Where the labels land (spec.monitoring.groundTruth.location)."""
    ground_truth: dict
    """How they join (LabelSpec's fields: the columns, maxDelay in seconds,
    and the request log's sample rate)."""
    window_seconds: float
    min_rows: int
    max_drop: float
    versions: dict[str, dict] = field(default_factory=dict)
    """Served version -> {"role": ..., "trained": the registered metric or None}."""
    threshold: float = 0.5
    classes: list[str] = field(default_factory=list)
    pair: list[str] = field(default_factory=list)
    """[champion, challenger] during a rollout."""
    tracking_uri: str = ""

    @classmethod
    def read(cls, folder: Path) -> "OutcomeJob":
        """From <folder>/job.json, else the Job's variable; what the runner
        adds and this job does not read (the feature repository) is left out."""
        path = folder / "job.json"
        data = json.loads(path.read_text() if path.exists() else os.environ[ENV])
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


def run(folder: Path, now: float | None = None) -> dict:
    job = OutcomeJob.read(folder)
    now = time.time() if now is None else now
    spec = LabelSpec(**job.ground_truth)
    since = now - job.window_seconds
    labels = read_labels(job.labels, spec, since=since)
    # A label that arrived in the window may judge a prediction made shortly
    # before it: the log is read a window (or the max delay) further back,
    # so it is matched, not counted as lost; only the window's predictions
    # are judged.
    before = since - min(job.window_seconds, spec.max_delay_seconds)
    joined = join_labels(prediction_batches(job.request_log, since=before), labels, spec, now=now)
    judged = joined.joined.filter(pc.greater_equal(joined.joined["ts"], since))
    result = {"service": job.service, "model": job.model, "at": now, "task": job.task, "metric": job.metric,
              "max_drop": job.max_drop, "min_rows": job.min_rows, "window_seconds": job.window_seconds,
              "labels": joined.counts, "pending": joined.pending, "delay_seconds": joined.delays}
    result["versions"] = judged_versions(job, judged)
    if len(job.pair) == 2:
        result["pairs"] = paired_losses(job, judged)
    if job.tracking_uri:
        result["report"] = _log_report(job, result)
    write_atomic(folder / "latest.json", json.dumps(result))
    return result


def judged_versions(job: OutcomeJob, table: pa.Table) -> dict[str, dict]:
    """Each served version's live metric over its labelled predictions (the
    joined rows), and how far it dropped below the metric it was trained to
    (positive: worse), both with their intervals."""
    out = {}
    for version, served in job.versions.items():
        rows = _rows_of(table, version, served.get("role", "primary"))
        entry = {"role": served.get("role", "primary"), "rows": rows.num_rows, "trained": served.get("trained")}
        if rows.num_rows:
            quality = _quality(job, rows)
            live = quality.metrics[job.metric]
            entry["live"] = _estimate(live)
            if served.get("trained") is not None and math.isfinite(live.value):
                entry["drop"] = _estimate(drop(job.task, job.metric, live, float(served["trained"])))
        out[version] = entry
    return out


def paired_losses(job: OutcomeJob, table: pa.Table) -> dict:
    """Per-request losses of the champion (its paired answers) and the
    challenger on the requests both answered and whose labels arrived."""
    champion, challenger = job.pair
    theirs = _rows_of(table, challenger, "canary")
    ours = _rows_of(table, champion, "paired")
    both = theirs.join(ours.select(["key", "row", "output"]).rename_columns(["key", "row", "champion_output"]),
                       keys=["key", "row"], join_type="inner")
    labels = both.column("label").to_pylist()
    ours_lost = losses(job, both.column("champion_output").to_pylist(), labels)
    theirs_lost = losses(job, both.column("output").to_pylist(), labels)
    return {"champion": champion, "challenger": challenger,
            "losses": {"champion": asdict(Stream.of(ours_lost)), "challenger": asdict(Stream.of(theirs_lost)),
                       "differences": asdict(Stream.of(theirs_lost - ours_lost))}}


def losses(job: OutcomeJob, outputs: list, labels: list) -> np.ndarray:
    """One loss per request: log loss for binary and multiclass answers,
    squared error for regression (lower is better, comparable per request)."""
    if job.task == "regression":
        return (np.asarray(outputs, dtype=float) - np.asarray(labels, dtype=float)) ** 2
    if job.task == "multiclass":
        index = {c: i for i, c in enumerate(job.classes)}
        picked = [row[index[str(y)] if str(y) in index else int(y)] for row, y in zip(outputs, labels, strict=True)]
        return -np.log(np.clip(np.asarray(picked, dtype=float), EPSILON, 1.0))
    p = np.clip(np.asarray(outputs, dtype=float), EPSILON, 1 - EPSILON)
    y = np.asarray([float(v) for v in labels])
    return -(y * np.log(p) + (1 - y) * np.log(1 - p))


def _rows_of(table: pa.Table, version: str, role: str) -> pa.Table:
    mask = pc.and_(pc.equal(table.column("version"), version), pc.equal(table.column("role"), role))
    return table.filter(mask)


def _quality(job: OutcomeJob, rows: pa.Table) -> LiveQuality:
    return live_quality(job.task, rows.column("output").to_pylist(), rows.column("label").to_pylist(),
                        metrics=[job.metric], threshold=job.threshold, classes=tuple(job.classes))


def _estimate(value: Estimate) -> dict:
    return {k: (round(v, 6) if math.isfinite(v) else None)
            for k, v in (("value", value.value), ("low", value.low), ("high", value.high))}


def _log_report(job: OutcomeJob, result: dict) -> str:
    import mlflow

    from kubeloop.registry.headers import defer_feast_headers

    defer_feast_headers()
    mlflow.set_tracking_uri(job.tracking_uri)
    mlflow.set_experiment(f"kubeloop/{job.model}/monitoring")
    tags = {"kubeloop.service": job.service, "kubeloop.report": "outcomes"}
    with mlflow.start_run(run_name=f"outcomes {job.service}", tags=tags) as run:
        mlflow.log_metrics({f"labels.{reason}": n for reason, n in result["labels"].items()})
        for version, entry in result["versions"].items():
            if entry.get("live") and entry["live"]["value"] is not None:
                mlflow.log_metrics({f"live.{job.metric}.v{version}": entry["live"]["value"],
                                    f"rows.v{version}": entry["rows"]})
        mlflow.log_dict(result, "outcomes/report.json")
        return f"runs:/{run.info.run_id}/outcomes/report.json"


def main(argv: list[str] | None = None) -> int:
    return run_job("outcomes", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
