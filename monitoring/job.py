"""The drift job of one InferenceService: the training data of the served
version (rebuilt from the version's own feature store, cached per version)
against the request log's window, over the version's input columns (its
signature); writes latest.json and an HTML report, and logs the run to
MLflow.

    python -m kubeloop.monitoring.job <folder> [--summary PATH]

The job comes from <folder>/job.json, else from $KUBELOOP_DRIFT_JOB (a Job's
Pod on a cluster); --summary also writes the result, compact, to PATH (the
Pod's termination message, which the operator reads).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from kubeloop.api.jobs import SUMMARY_BYTES
from kubeloop.files import write_atomic

log = logging.getLogger("kubeloop.monitoring.job")


@dataclass(frozen=True)
class DriftJob:
    service: str
    model: str
    version: str
    tracking_uri: str
    feast_repo: str
    request_log: str
    """The service's request log: a folder or an s3:// prefix."""
    window_seconds: float
    threshold: float
    features: list[str]
    """The columns to compare (spec.monitoring.features); empty = all columns."""
    columns: list[str]
    """The served version's input columns, in order (its signature): what a
    logged request row holds."""
    min_rows: int
    sample_rows: int | None = 50_000
    feature_store: str = ""
    """The version's feature store (StoreLocation JSON, its
    kubeloop.feature_store tag); empty = the default repository feast_repo."""

    @classmethod
    def read(cls, folder: Path) -> "DriftJob":
        path = folder / "job.json"
        text = path.read_text() if path.exists() else os.environ["KUBELOOP_DRIFT_JOB"]
        return cls(**json.loads(text))


def reference_data(job: DriftJob, folder: Path) -> pd.DataFrame:
    """The training split the served version learned from: the sample its
    training run logged to the registry, else (a version registered before
    runs logged one) rebuilt from the feature store it was trained on.
    Cached per version."""
    cached = folder / f"reference-{job.model}-{job.version}.parquet"
    if cached.exists():
        return pd.read_parquet(cached)
    from mlflow import MlflowClient

    from kubeloop.registry import tags

    version = MlflowClient(job.tracking_uri).get_model_version(job.model, job.version)
    if tags.REFERENCE in version.tags:
        import mlflow

        path = mlflow.artifacts.download_artifacts(version.tags[tags.REFERENCE], dst_path=str(folder / "download"),
                                                   tracking_uri=job.tracking_uri)
        frame = pd.read_parquet(path, columns=job.columns)
        frame.to_parquet(cached, index=False)
        shutil.rmtree(folder / "download", ignore_errors=True)
        return frame
    return _rebuilt_reference(job, folder, version, cached)


def _rebuilt_reference(job: DriftJob, folder: Path, version, cached: Path) -> pd.DataFrame:  # noqa: ANN001 - ModelVersion
    from kubeloop.api.training import TrainingJobSpec
    from kubeloop.components.data import build_dataset, load_split
    from kubeloop.featurestore.store import StoreLocation
    from kubeloop.registry import tags

    spec = TrainingJobSpec.model_validate_json(version.tags[tags.TRAINING_SPEC])
    staging = folder / "reference-build.parquet"
    info = build_dataset(spec, StoreLocation.resolve(job.feature_store, job.feast_repo).to_json(), staging)
    frame, _ = load_split(staging, info, "train")
    frame[job.columns].to_parquet(cached, index=False)
    staging.unlink()
    return frame[job.columns]


def run(folder: Path) -> dict:
    import mlflow

    from kubeloop.monitoring.drift import evaluate, load_requests

    job = DriftJob.read(folder)
    features = [f for f in (job.features or job.columns) if f in job.columns]
    since = time.time() - job.window_seconds
    current = load_requests(job.request_log, since, job.columns)
    base = {"service": job.service, "model": job.model, "version": job.version, "at": time.time()}
    if len(current) < job.min_rows:
        result = {**base, "skipped": f"only {len(current)} logged rows in the window (at least {job.min_rows})",
                  "rows": len(current), "threshold": job.threshold}
        write_atomic(folder / "latest.json", json.dumps(result))
        return result
    reference = reference_data(job, folder)
    drift = evaluate(reference, current, features, job.threshold, sample_rows=job.sample_rows,
                     report=folder / "report.html")
    mlflow.set_tracking_uri(job.tracking_uri)
    mlflow.set_experiment(f"kubeloop/{job.model}/monitoring")
    with mlflow.start_run(run_name=f"drift {job.service}", tags={"kubeloop.service": job.service,
                                                               "kubeloop.model_version": job.version}) as run:
        mlflow.log_metrics({"drift_share": drift.share, "rows": drift.rows, "drifted": float(drift.drifted),
                            **{f"score.{k}": v for k, v in drift.scores.items()}})
        mlflow.log_artifact(str(folder / "report.html"), "drift")
        report = f"runs:/{run.info.run_id}/drift/report.html"
    result = {**base, **json.loads(drift.to_json()), "report": report}
    write_atomic(folder / "latest.json", json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> int:
    return run_job("drift", run, argv)


def run_job(what: str, run: Callable[[Path], dict], argv: list[str] | None = None) -> int:
    """A monitoring job's entry point (drift and outcomes alike): run it on
    its folder; a failure is recorded as its result for the operator, which
    reports it in a condition; --summary also writes the result, compact,
    to PATH (a Job Pod's termination message)."""
    parser = argparse.ArgumentParser(prog=f"kubeloop {what} job")
    parser.add_argument("folder", type=Path)
    parser.add_argument("--summary", type=Path, help="also write the result here, at most 4 KiB")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        result, code = run(args.folder), 0
    except Exception as exc:  # recorded for the operator, which reports it in a condition
        log.exception("%s job failed", what)
        result, code = {"error": f"{type(exc).__name__}: {exc}", "at": time.time()}, 1
        write_atomic(args.folder / "latest.json", json.dumps(result))
    if args.summary:
        args.summary.write_text(summary(result))
    log.info("%s: %s", what, {k: result.get(k) for k in ("share", "drifted", "rows", "labels", "skipped", "error")})
    return code


def summary(result: dict) -> str:
    """The result as the operator needs it, within SUMMARY_BYTES: without
    the test names, and without the per-feature scores if still too long."""
    compact = {k: v for k, v in result.items() if k != "methods"}
    text = json.dumps(compact, separators=(",", ":"))
    if len(text.encode()) > SUMMARY_BYTES:
        text = json.dumps({k: v for k, v in compact.items() if k != "scores"}, separators=(",", ":"))
    return text


if __name__ == "__main__":
    raise SystemExit(main())
