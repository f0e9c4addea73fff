"""The torch trainer: determinism, resume, checkpointing, DDP."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kubeloop.components.evaluation import evaluate
from tests.components.test_objectstore import seaweed  # noqa: F401 - the fixture
from kubeloop.components.training import (
    NAIVE_LOADER, TrainSettings, make_loader, pick_precision, predict, train, train_distributed,
    tuned_loader_settings,
)


def auc(model, x, y) -> float:
    return evaluate("binary", y, predict(model, x))["auc"]

SETTINGS = TrainSettings(epochs=3, batch_size=512, learning_rate=0.003, seed=5)


def weights(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_the_same_seed_gives_the_same_model(dataset):
    a = train(dataset["x"], dataset["y"], None, None, SETTINGS)
    b = train(dataset["x"], dataset["y"], None, None, SETTINGS)
    assert torch.equal(weights(a.model), weights(b.model))
    c = train(dataset["x"], dataset["y"], None, None, TrainSettings(**{**SETTINGS.__dict__, "seed": 6}))
    assert not torch.equal(weights(a.model), weights(c.model))


def test_the_model_learns_the_signal(dataset):
    result = train(dataset["x"], dataset["y"], dataset["x_holdout"], dataset["y_holdout"], SETTINGS)
    assert result.history[-1]["val_auc"] > 0.75
    assert result.history[-1]["loss"] < result.history[0]["loss"]
    assert result.precision == "fp32" and result.device == "cpu"


def test_an_interrupted_run_resumes_and_ends_identical(dataset, tmp_path):
    reference = train(dataset["x"], dataset["y"], None, None, SETTINGS)

    class Crash(Exception):
        pass

    def crash_after_second_epoch(record):
        if record["epoch"] == 2:
            raise Crash()

    with pytest.raises(Crash):
        train(dataset["x"], dataset["y"], None, None, SETTINGS, checkpoint_dir=tmp_path,
              progress=crash_after_second_epoch)
    resumed = train(dataset["x"], dataset["y"], None, None, SETTINGS, checkpoint_dir=tmp_path)
    assert resumed.resumed_from_epoch == 2
    assert torch.allclose(weights(resumed.model), weights(reference.model), atol=1e-6)


def test_activation_checkpointing_does_not_change_the_result(dataset):
    plain = train(dataset["x"], dataset["y"], None, None, SETTINGS)
    checkpointed = train(dataset["x"], dataset["y"], None, None,
                         TrainSettings(**{**SETTINGS.__dict__, "activation_checkpointing": True}))
    assert torch.allclose(weights(plain.model), weights(checkpointed.model), atol=1e-5)


def test_gradient_accumulation_steps_once_per_group(dataset):
    accumulated = train(dataset["x"], dataset["y"], dataset["x_holdout"], dataset["y_holdout"],
                        TrainSettings(**{**SETTINGS.__dict__, "batch_size": 256, "gradient_accumulation_steps": 2}))
    assert accumulated.history[-1]["val_auc"] > 0.75


def test_ddp_with_two_processes_matches_one_process(dataset, tmp_path):
    """Two gloo ranks with half the batch each see the same global batch as
    one process; dropout masks and shard order differ, so the metrics agree
    within a tolerance, not exactly. Tolerance: 0.02 AUC."""
    single = train(dataset["x"], dataset["y"], None, None, SETTINGS)
    ddp = train_distributed(dataset["x"], dataset["y"], TrainSettings(**{**SETTINGS.__dict__, "batch_size": 256}),
                            processes=2, workdir=tmp_path)
    auc_single = auc(single.model, dataset["x_holdout"], dataset["y_holdout"])
    auc_ddp = auc(ddp.model, dataset["x_holdout"], dataset["y_holdout"])
    assert abs(auc_single - auc_ddp) < 0.02, (auc_single, auc_ddp)
    assert len(ddp.history) == SETTINGS.epochs
    # Rank 0 measures and profiles its own loop.
    assert (ddp.bottleneck["rank"], ddp.bottleneck["world"]) == (0, 2)
    assert ddp.trace is not None and ddp.trace.parent == tmp_path / "profile"


def test_tuned_and_naive_loaders_yield_the_same_rows(dataset):
    x = torch.as_tensor(dataset["x"][:1000])
    y = torch.as_tensor(dataset["y"][:1000])
    tuned, _ = make_loader(x, y, 64, tuned_loader_settings(torch.device("cpu")), seed=1)
    naive, _ = make_loader(x, y, 64, NAIVE_LOADER, seed=1)
    for (xt, yt), (xn, yn) in zip(tuned, naive, strict=False):
        assert torch.equal(xt, xn) and torch.equal(yt, yn)


def test_precision_follows_the_device():
    assert pick_precision(torch.device("cpu")) == "fp32"


def test_metrics_on_the_hold_out(dataset):
    model = train(dataset["x"], dataset["y"], None, None, SETTINGS).model
    metrics = evaluate("binary", dataset["y_holdout"], predict(model, dataset["x_holdout"]), threshold=0.2)
    assert 0 <= metrics["ece"] < 0.05 and metrics["brier"] < 0.05
    assert metrics["rows"] == len(dataset["y_holdout"])
    assert np.isfinite(metrics["auc"])


def test_the_trainjob_entry_point_trains_under_torchrun(dataset, job_spec, tmp_path):
    """What kubeloop's Trainer runtime runs on each node, here on one machine
    with two processes, on data its pipeline prepared (the kfp backend's
    multi-node step): rank 0 leaves the model where the run's output says.
    Run again (as a restarted JobSet's Pods are), both ranks resume from rank
    0's published checkpoint: no epoch is trained twice."""
    import json
    import os

    from kubeloop.components.initializer import publish_data
    from kubeloop.components.model import load_model
    from kubeloop.components.trainer_run import RUN_ENV, TrainerRun

    prefix = tmp_path / "run"
    run = TrainerRun(spec=job_spec.to_json(), pipeline_run="p", owner="team/fraud", spec_hash="h", git_sha="sha",
                     tracking_uri="", prefix=str(prefix), trainjob="team/train-p", output=str(prefix / "model"))
    (tmp_path / "scratch").mkdir()
    publish_data(tmp_path / "scratch", dataset["path"], dataset["info"].to_json(), "{}", run.data)
    env = {**os.environ, RUN_ENV: run.to_json()}
    first = _torchrun(["--trainer-run"], env)
    assert first.returncode == 0, first.stderr[-3000:]
    output = prefix / "model"
    assert auc(load_model(output), dataset["x_holdout"], dataset["y_holdout"]) > 0.75
    assert json.loads((output / "result.json").read_text())["resumed_from_epoch"] == 0
    assert (prefix / "checkpoints" / "rank0.pt").exists() and not (prefix / "checkpoints" / "rank1.pt").exists()
    again = _torchrun(["--trainer-run"], env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((output / "result.json").read_text())["resumed_from_epoch"] == job_spec.hyperparameters.epochs


def _torchrun(args: list[str], env: dict):  # noqa: ANN202 - a CompletedProcess
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "kubeloop.components.distributed", *args],
                          capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"}, timeout=300)


def test_the_trainer_backends_pods_prepare_train_register_once_and_optimise(
        seaweed, job_spec, tracking, tmp_path, monkeypatch):  # noqa: F811 - the fixture
    """What the trainer backend's TrainJob runs, here as processes of one
    machine (the real TrainJob is the real-node e2e test's), against a real
    S3 (SeaweedFS): the dataset initializer joins the job's store, published
    as Pods open it (its feature_store.yaml as text, as the ConfigMap gives
    it; registry and Parquet sources in object storage), validates, and
    writes below the run's prefix; two torchrun processes train, and rank 0
    evaluates and registers with the TrainJob in the lineage. Rank 0 started
    again after it registered (its Pod replaced) registers nothing more."""
    import dataclasses
    import os
    import subprocess
    import sys

    import boto3
    from mlflow import MlflowClient

    from kubeloop.components.data import DatasetInfo
    from kubeloop.components.objects import download
    from kubeloop.api.training import DataValidation
    from kubeloop.components.trainer_run import DATA_WRONG_EXIT, INFO, NO_STORE, RUN_ENV, STORE_ENV, TrainerRun
    from kubeloop.dev import objectstore
    from kubeloop.featurestore.generate import Scenario, default_start
    from kubeloop.featurestore.store import create_repository
    from kubeloop.registry import tags
    from kubeloop.featurestore.publish import publish_sources

    for name, value in objectstore.env(seaweed.endpoint, seaweed.credentials).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # this test's keys, not an earlier test's
    repo = create_repository(tmp_path / "repo", Scenario(start=default_start(30), days=30, cards=1200),
                             registry="s3://feast/trainer-run/registry.db")
    publish_sources(repo, "s3://feast/trainer-run/data", seaweed.endpoint)
    run = TrainerRun(spec=job_spec.to_json(), pipeline_run="team-fraud-g1-abc", owner="team/fraud", spec_hash="h",
                     git_sha="sha", tracking_uri=tracking, prefix="s3://training/team/team-fraud-g1-abc",
                     trainjob="team/train-fraud")
    env = {**os.environ, RUN_ENV: run.to_json(), "OMP_NUM_THREADS": "1"}
    initializer = subprocess.run([sys.executable, "-m", "kubeloop.components.initializer"], capture_output=True,
                                 text=True, timeout=300, env={**env, "STORAGE_URI": run.data,
                                                              STORE_ENV: (repo / "feature_store.yaml").read_text()})
    assert initializer.returncode == 0, initializer.stderr[-3000:]
    info = DatasetInfo.from_json(download(f"{run.data}/{INFO}", tmp_path / INFO).read_text())
    again = subprocess.run([sys.executable, "-m", "kubeloop.components.initializer"], capture_output=True,
                           text=True, timeout=300, env={**env, STORE_ENV: "project: unreachable"})
    assert again.returncode == 0 and "already at" in again.stderr, again.stderr[-3000:]  # kept, not joined again
    # Wrong data ends with the exit status the runtime fails the TrainJob on at once, its reason the last line.
    strict = job_spec.model_copy(update={"validation": DataValidation.model_validate(
        {"mode": "fail", "rules": [{"column": "credit_limit", "max": 0}], "champion": {"enabled": False}})})
    wrong = dataclasses.replace(run, spec=strict.to_json(), prefix="s3://training/team/team-fraud-g1-strict")
    for store, says in (((repo / "feature_store.yaml").read_text(), "column 'credit_limit'"), ("", NO_STORE)):
        refused = subprocess.run([sys.executable, "-m", "kubeloop.components.initializer"], capture_output=True,
                                 text=True, timeout=300, env={**env, RUN_ENV: wrong.to_json(), STORE_ENV: store})
        last = refused.stderr.strip().splitlines()[-1]
        assert refused.returncode == DATA_WRONG_EXIT and says in last, refused.stderr[-3000:]
    for _ in range(2):  # the second: rank 0 again after it registered
        nodes = _torchrun(["--trainer-run"], env)
        assert nodes.returncode == 0, nodes.stderr[-3000:]
    versions = MlflowClient(tracking).search_model_versions(f"name = '{job_spec.model_name}'")
    assert len(versions) == 1, [v.version for v in versions]
    version = versions[0]
    assert version.tags[tags.TRAINJOB] == "team/train-fraud" and version.tags[tags.PIPELINE_RUN] == run.pipeline_run
    assert version.tags["dataset_hash"] == info.dataset_hash  # trained on what the initializer prepared
    assert float(version.tags["metric.auc"]) > 0.75
    assert "was registered by this run" in nodes.stderr
    _optimise_in_a_pod(version, tracking, env)


def _optimise_in_a_pod(version, tracking: str, env: dict) -> None:  # noqa: ANN001 - an MLflow ModelVersion
    """The trainer backend's optimisation Job's Pod on that version: it
    rebuilds the data from the published store the version recorded (no
    store of its own), measures and registers the winner; started again, it
    registers nothing more."""
    import subprocess
    import sys

    from mlflow import MlflowClient

    from kubeloop.api.optimization import OptimizedModelSpec
    from kubeloop.components.trainer_run import OPTIMIZATION_ENV, OptimizationRun
    from kubeloop.registry import tags

    number = str(version.version)
    spec = OptimizedModelSpec.model_validate({"source": {"name": version.name, "version": number},
                                             "techniques": ["onnx", "dynamic-int8"], "batchSizes": [1, 32]})
    run = OptimizationRun(spec=spec.to_json(), source_version=number, pipeline_run="team-fast-g1-abc",
                          owner="team/fast", git_sha="sha", tracking_uri=tracking)
    for _ in range(2):
        pod = subprocess.run([sys.executable, "-m", "kubeloop.components.optimizer_pod"], capture_output=True,
                             text=True, timeout=600, env={**env, OPTIMIZATION_ENV: run.to_json()})
        assert pod.returncode == 0, pod.stderr[-3000:]
    (winner,) = [v for v in MlflowClient(tracking).search_model_versions(f"name = '{version.name}'")
                 if v.tags.get(tags.PIPELINE_RUN) == run.pipeline_run]
    assert winner.tags[tags.SOURCE] == f"{version.name}/{number}"
    assert winner.tags[tags.TECHNIQUE] in ("source", "onnx", "dynamic-int8")
