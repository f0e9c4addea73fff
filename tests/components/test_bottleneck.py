"""The bottleneck report of a training run, on the local backend, CPU: the
real trainer measures its loop and profiles a few steps, and the train step
records the report on its MLflow run."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components import steps
from kubeloop.components.bottleneck import LOADER_BOUND, VERDICTS
from kubeloop.components.profiling import TRACE, LoopMeter
from kubeloop.components.training import TrainSettings, train

ROWS, BATCH, EPOCHS = 2048, 64, 2


def synthetic(rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 6)).astype(np.float32)
    return x, (x[:, 0] + rng.normal(0, 0.5, rows) > 0).astype(np.float32)


def chrome_trace(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def check_shares(report: dict) -> None:
    shares = report["shares"]
    assert set(shares) == {"loader", "copy", "step", "other"}
    assert all(0.0 <= v <= 1.0 for v in shares.values()), shares
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
    # The parts are measured inside the loop's wall time, never beyond it.
    seconds = report["seconds"]
    assert seconds["loader"] + seconds["copy"] + seconds["step"] <= seconds["wall"]


def test_a_run_reports_where_its_time_went_and_traces_a_few_steps(tmp_path):
    x, y = synthetic(ROWS)
    result = train(x, y, None, None, TrainSettings(epochs=EPOCHS, batch_size=BATCH), profile_dir=tmp_path)
    report = result.bottleneck
    check_shares(report)
    assert report["verdict"] in VERDICTS and report["advice"].startswith(f"{report['verdict']}: ")
    # The profiled steps (and the run's first, one-off costs) are left out.
    total_steps = EPOCHS * ROWS // BATCH
    assert report["excluded_steps"] == 5 and report["steps"] == total_steps - 5
    assert report["samples"] == report["steps"] * BATCH
    assert report["host_to_device"].startswith("none") and report["gpu_memory_mib"] == "not available"
    assert result.trace == tmp_path / TRACE and report["trace"] == TRACE
    events = chrome_trace(result.trace)["traceEvents"]
    recorded = {e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert len(recorded) == 3, recorded
    assert any(e.get("name") == "aten::addmm" for e in events)


def test_a_run_shorter_than_the_profiler_schedule_still_traces_and_counts_every_step(tmp_path):
    x, y = synthetic(2 * BATCH)
    result = train(x, y, None, None, TrainSettings(epochs=1, batch_size=BATCH), profile_dir=tmp_path)
    assert (result.bottleneck["steps"], result.bottleneck["excluded_steps"]) == (2, 0)
    check_shares(result.bottleneck)
    assert chrome_trace(result.trace)["traceEvents"]


def test_the_meter_charges_a_slow_loader_to_the_loader():
    """A loader that sleeps before each batch and a step that does not:
    the wait is the loader's, whatever the machine's speed."""

    class SlowLoader:
        def __len__(self) -> int:
            return 4

        def __iter__(self):  # noqa: ANN204
            for _ in range(len(self)):
                time.sleep(0.02)
                yield torch.zeros(BATCH, 3)

    meter = LoopMeter(torch.device("cpu"), None, total_steps=4)
    with meter.epoch(SlowLoader()) as batches:
        for batch in batches:
            with meter.timed("step"):
                batch.sum()
            meter.count(len(batch))
    report = meter.report(num_workers=0, pin_memory=False)
    check_shares(report)
    assert report["verdict"] == LOADER_BOUND and report["seconds"]["loader"] >= 4 * 0.02
    assert report["advice"].endswith("raise workers (now 0).")


def test_the_train_step_records_the_report_on_its_run(small_dataset, tracking, tmp_path):
    path, info = small_dataset
    spec = TrainingJobSpec.model_validate({
        "modelName": "bottleneck", "features": {"featureViews": ["v"], "labels": {"source": "s", "column": "fault"}},
        "hyperparameters": {"epochs": 2, "batchSize": 16}}).to_json()
    run_id = steps.train_step(spec, str(path), info.to_json(), str(tmp_path / "model"), tracking, "ml-run-1",
                              "ml/job", "h", "deadbeef")
    client = MlflowClient(tracking)
    run = client.get_run(run_id)
    assert run.data.tags["bottleneck.verdict"] in VERDICTS
    assert run.data.tags["bottleneck.advice"].startswith(run.data.tags["bottleneck.verdict"])
    shares = {k: run.data.metrics[f"bottleneck.{k}_share"] for k in ("loader", "copy", "step", "other")}
    assert sum(shares.values()) == pytest.approx(1.0, abs=1e-6)
    assert run.data.metrics["bottleneck.samples_per_second"] > 0
    assert {a.path for a in client.list_artifacts(run_id, "bottleneck")} == {"bottleneck/bottleneck.json",
                                                                            f"bottleneck/{TRACE}"}
    report = json.loads(Path(client.download_artifacts(run_id, "bottleneck/bottleneck.json", str(tmp_path)))
                        .read_text())
    assert report["verdict"] == run.data.tags["bottleneck.verdict"]
    assert report["shares"] == pytest.approx(shares)
    assert chrome_trace(Path(client.download_artifacts(run_id, f"bottleneck/{TRACE}", str(tmp_path))))
