"""`kubeloop reproduce` against a real MLflow store (sqlite) and a real Feast
repository, on the local backend's terms: the version is trained and
registered by the training pipeline's own step bodies (as kfp's local runner
runs them), then rebuilt from its tags by the CLI."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from mlflow import MlflowClient
from typer.testing import CliRunner

from kubeloop.cli.main import app
from kubeloop.components import steps
from kubeloop.featurestore.store import StoreLocation
from kubeloop.registry import tags

MODEL = "fraud-reproduce"


def reproduce_cli(tracking: str, *args: str):
    result = CliRunner().invoke(app, ["reproduce", *args, "--tracking-uri", tracking])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


@pytest.fixture
def registered(tracking, feature_repo, job_spec, tmp_path):
    """A copy of the session's repository (the test alters it), and version 1
    of MODEL trained on it through the pipeline's steps, made challenger."""
    repo = shutil.copytree(feature_repo, tmp_path / "repo")
    wire = {**job_spec.to_wire(), "modelName": MODEL, "promotion": {"registerAs": "challenger"}}
    spec, store = json.dumps(wire), StoreLocation(path=str(repo)).to_json()
    data, model_dir = str(tmp_path / "data.parquet"), str(tmp_path / "model")
    info = steps.training_data_step(spec, store, "", data)
    run_id = steps.train_step(spec, data, info, model_dir, tracking, "ns-fraud-1", "ns/fraud", "h", "deadbeef")
    evaluation = steps.evaluate_step(spec, data, info, model_dir, tracking, run_id)
    steps.register_step(spec, info, model_dir, evaluation, tracking, run_id, "ns-fraud-1", "ns/fraud", "deadbeef")
    return repo


def alter_one_card(repo) -> None:
    """Double one card's credit limit in card_profile's source: the store
    drifts under a version trained on it, its definitions untouched."""
    path = repo / "data" / "card_profile.parquet"
    profiles = pd.read_parquet(path)
    card = pd.read_parquet(repo / "data" / "transactions.parquet")["card_id"].iloc[0]
    profiles.loc[profiles["card_id"] == card, "credit_limit"] *= 2
    profiles.to_parquet(path)


def test_a_version_reproduces_and_a_drifted_view_is_named(tracking, registered):
    """Local backend: the rebuilt version has the recorded dataset hash and
    its auc within 0.01 (the same seed on the same CPU: in fact identical
    outputs); after one card's profile changes in the store, the rebuild
    differs and the report names card_profile (and the on-demand view
    computed from it), and no other view."""
    client = MlflowClient(tracking)
    version = client.get_model_version(MODEL, "1")
    assert set(json.loads(version.tags[tags.VIEW_HASHES])) == {*json.loads(version.tags["feature_views"]), "(labels)"}
    assert version.tags[tags.FACTORY_CODE]

    same = reproduce_cli(tracking, MODEL, "1", "--json")
    assert same.exit_code == 0, same.output
    report = json.loads(same.stdout)
    assert report["verdict"] == "reproduced"
    assert report["dataset"]["recorded"] == report["dataset"]["now"] == version.tags["dataset_hash"]
    auc = next(m for m in report["metrics"] if m["name"] == "auc")
    assert auc["checked"] and auc["delta"] <= 0.01
    assert report["outputs"]["rows"] > 0 and report["outputs"]["max_abs"] < 1e-4
    # The code that rebuilt it is this checkout, not the "deadbeef" that trained it: named, not failed.
    assert any(c.startswith("git sha: deadbeef -> ") for c in report["causes"])
    # Definitions fingerprint alike on every read, the on-demand view's too (it used not to).
    assert not any(r["changed"] for r in [*report["views"], *report["view_data"]])
    rebuild = client.get_run(report["run_id"])
    assert rebuild.data.tags[tags.REPRODUCES] == f"{MODEL}/1"
    assert rebuild.data.tags["kubeloop.reproduction.verdict"] == "reproduced"
    assert [a.path for a in client.list_artifacts(report["run_id"], "reproduction")] == ["reproduction/report.json"]

    alter_one_card(registered)
    drifted = reproduce_cli(tracking, MODEL, "1", "--json")
    assert drifted.exit_code == 1, drifted.output
    report = json.loads(drifted.stdout)
    assert report["dataset"]["changed"] and report["verdict"].startswith("differs: dataset hash")
    # card_profile, and the on-demand view that divides the amount by its credit_limit; not the others.
    assert [r["name"] for r in report["view_data"] if r["changed"]] == ["card_profile", "transaction_context"]
    assert "feature view card_profile: values changed" in report["causes"]
    assert not any(r["changed"] for r in report["views"])  # the definitions are as they were

    # Neither rebuild registered anything or moved an alias.
    assert [str(v.version) for v in client.search_model_versions(f"name = '{MODEL}'")] == ["1"]
    assert str(client.get_model_version_by_alias(MODEL, "challenger").version) == "1"


def optimise(tracking: str, work, technique: str) -> str:
    """Version 1 optimised by the optimisation pipeline's steps (as kfp's
    local runner runs them) with one technique: the version it registers."""
    import torch

    from kubeloop.components.optimize import optimization_data_step, optimize_step, register_optimized_step

    spec = json.dumps({"source": {"name": MODEL, "version": "1"}, "techniques": [technique],
                       "accuracyBudget": {"maxDrop": 0.05}, "batchSizes": [1, 8],
                       "latencySLO": {"batchSize": 8, "milliseconds": 50}})
    data, source, out = str(work / "opt.parquet"), str(work / "opt-source"), str(work / "opt-work")
    threads = torch.get_num_threads()
    try:
        info = optimization_data_step(spec, "1", tracking, "", data, source)
        results = optimize_step(spec, info, data, source, tracking, "1", "ns-opt-1", "ns/opt", out, "deadbeef")
    finally:
        torch.set_num_threads(threads)  # optimize_step pins one thread for the whole process
    return register_optimized_step(spec, "1", results, out, tracking, "ns-opt-1", "ns/opt")["model"]["version"]


def test_an_optimised_version_reproduces_from_its_source_and_technique(tracking, registered, tmp_path):
    """Local backend: an OptimizedModel's winner (onnxruntime int8 of
    version 1: onnxruntime at batch 8 beats PyTorch eager on this MLP) is
    rebuilt from the source's rows and network with the technique the
    optimiser chose: the same dataset hash, its budget metric within 0.01,
    the served ONNX models' outputs equal (a rebuild of the source instead
    differs by the quantisation); the report says the timing run was not
    repeated. With the store drifted under it, the rebuild differs and
    names the view."""
    client = MlflowClient(tracking)
    version = optimise(tracking, tmp_path, "onnx-int8")
    technique = client.get_model_version(MODEL, version).tags["kubeloop.technique"]
    assert technique == "onnx-int8", client.get_model_version(MODEL, version).tags[tags.SELECTION]

    same = reproduce_cli(tracking, MODEL, version, "--json")
    assert same.exit_code == 0, same.output
    report = json.loads(same.stdout)
    assert report["verdict"] == "reproduced"
    assert report["dataset"]["recorded"] == report["dataset"]["now"] == \
        client.get_model_version(MODEL, "1").tags["dataset_hash"]
    auc = next(m for m in report["metrics"] if m["name"] == "auc")
    assert auc["checked"] and auc["delta"] <= 0.01
    assert report["outputs"]["rows"] > 0 and report["outputs"]["max_abs"] < 1e-5
    assert {"name": "technique", "recorded": technique, "now": technique, "changed": False} in report["code"]
    assert any(f"the technique it chose ({technique})" in note for note in report["notes"])
    assert client.get_run(report["run_id"]).data.tags[tags.REPRODUCES] == f"{MODEL}/{version}"

    alter_one_card(registered)
    drifted = json.loads(reproduce_cli(tracking, MODEL, version, "--json").stdout)
    assert drifted["verdict"].startswith("differs: dataset hash")
    assert "feature view card_profile: values changed" in drifted["causes"]
    assert sorted(str(v.version) for v in client.search_model_versions(f"name = '{MODEL}'")) == ["1", version]


def test_the_table_says_the_verdict(tracking, registered):
    """Local backend: the human form of the same report."""
    shown = reproduce_cli(tracking, MODEL, "1", "--tolerance", "0.02")
    assert shown.exit_code == 0, shown.output
    assert "dataset hash" in shown.stdout and "metric auc" in shown.stdout and "(≤ 0.02)" in shown.stdout
    assert any(line.startswith("reproduced") for line in shown.stdout.splitlines())


def test_what_cannot_be_reproduced_says_why(tracking):
    """Unknown versions, and trained or optimised versions without lineage,
    exit 2 with a message that names the version and the way forward."""
    client = MlflowClient(tracking)
    client.create_registered_model("legacy")
    client.create_model_version("legacy", source="s3://models/legacy/1")
    client.create_model_version("legacy", source="s3://models/legacy/2",
                                tags={tags.SOURCE: "legacy/1", "kubeloop.technique": "dynamic-int8"})

    unknown = reproduce_cli(tracking, "legacy", "9")
    assert unknown.exit_code == 2 and "legacy has no version 9" in unknown.stdout
    bare = reproduce_cli(tracking, "legacy", "1")
    assert bare.exit_code == 2 and "has no lineage" in bare.stdout and "older kubeloop" in bare.stdout
    optimised = reproduce_cli(tracking, "legacy", "2")
    said = optimised.stdout.replace("\n", " ")
    assert optimised.exit_code == 2 and "has no lineage (kubeloop.optimization_spec" in said
    assert "run its OptimizedModel again" in said
