"""Components (no cluster): the OptimizedModel spec fields that tune the
variants (batchSizes, calibrationSamples, distillation temperature, alpha and
widthRatio) change what torch and onnxruntime build and measure on CPU."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.components.model import save_model
from kubeloop.components.optimize import optimize_step
from kubeloop.components.training import TrainSettings, train
from kubeloop.components.variants import BUILDERS, BuildContext
from kubeloop.registry import tags

SOURCE = {"name": "m", "version": "1"}
# Enough rows for the student to learn, few enough to keep each build quick.
ROWS = 8000


@pytest.fixture(scope="module")
def teacher(dataset):
    return train(dataset["x"], dataset["y"], None, None,
                 TrainSettings(epochs=2, batch_size=512, learning_rate=0.003, seed=3)).model


def context(teacher, dataset, spec: dict, workdir, y=None) -> BuildContext:
    workdir.mkdir(parents=True, exist_ok=True)
    labels = dataset["y"][:ROWS] if y is None else y
    return BuildContext(teacher, dataset["x"][:ROWS], labels,
                        OptimizedModelSpec.model_validate({"source": SOURCE, **spec}), workdir)


def student(ctx: BuildContext):
    return BUILDERS["distillation"](ctx)


def test_a_student_is_the_same_whatever_drew_from_torchs_generator_before(teacher, dataset, tmp_path):
    """Its first weights come from the run's seed, so two builds of one spec
    are comparable bit for bit (the other tests rely on it)."""
    spec = {"techniques": ["distillation"], "distillation": {"widthRatio": 0.5, "epochs": 1}}
    holdout = dataset["x"][ROWS:ROWS + 512]
    first = student(context(teacher, dataset, spec, tmp_path / "first")).predict(holdout)
    torch.rand(1000)
    again = student(context(teacher, dataset, spec, tmp_path / "again")).predict(holdout)
    np.testing.assert_array_equal(first, again)


def test_batch_sizes_are_the_batch_sizes_the_variants_are_profiled_at(teacher, dataset, job_spec, tmp_path,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)  # the sqlite store keeps artifacts under ./mlruns
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking)
    client.create_registered_model("m")
    client.create_model_version("m", str(tmp_path / "source"),
                                tags={tags.TRAINING_SPEC: json.dumps(job_spec.to_wire())})
    save_model(teacher, tmp_path / "source")
    spec = OptimizedModelSpec.model_validate({"source": SOURCE, "techniques": ["onnx"], "batchSizes": [3, 12],
                                              "latencySLO": {"batchSize": 12, "milliseconds": 50}})
    threads = torch.get_num_threads()
    try:
        results = json.loads(optimize_step(spec.to_json(), dataset["info"].to_json(), str(dataset["path"]),
                                           str(tmp_path / "source"), tracking, "1", "ns-opt-1", "ns/opt",
                                           str(tmp_path / "work")))
    finally:
        torch.set_num_threads(threads)  # optimize_step pins one thread for the whole process
    run = client.get_run(results["run_id"])
    assert json.loads(run.data.params["batch_sizes"]) == [3, 12]
    children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    assert {c.data.tags["kubeloop.technique"] for c in children} == {"source", "onnx"}
    for child in children:
        profiled = {key.split(".")[1] for key in child.data.metrics if key.startswith("p50_ms.")}
        assert profiled == {"b3", "b12"}, child.data.tags["kubeloop.technique"]
    # Triton's batching plan accepts up to the largest batch size profiled.
    assert results["plan"]["max_batch_size"] == 12


def test_calibration_samples_are_the_training_rows_static_int8_calibrates_on(teacher, dataset, tmp_path):
    x = dataset["x"][:ROWS].copy()
    # One extreme row past the first 64 widens every activation range it
    # reaches, so the calibration shows whether it read that far.
    x[100] *= 50
    y = dataset["y"][:ROWS]

    def build(rows: np.ndarray, samples: int, name: str):
        spec = OptimizedModelSpec.model_validate({"source": SOURCE, "calibrationSamples": samples})
        (tmp_path / name).mkdir()
        return BUILDERS["static-int8"](BuildContext(teacher, rows, y[: len(rows)], spec, tmp_path / name))

    first_64 = build(x, 64, "first-64")
    only_64_given = build(x[:64], 2048, "only-64-given")
    all_rows = build(x, 2048, "all-rows")
    assert first_64.note == "calibrated on 64 training rows"
    assert all_rows.note == "calibrated on 2048 training rows"
    holdout = dataset["x_holdout"][:2000]
    assert np.array_equal(first_64.predict(holdout), only_64_given.predict(holdout))
    assert not np.allclose(first_64.predict(holdout), all_rows.predict(holdout), atol=1e-4)


def test_width_ratio_is_the_students_hidden_widths_over_the_teachers(teacher, dataset, tmp_path):
    widths = [block[0].out_features for block in teacher.body.blocks]
    assert widths == [64, 32]
    for ratio in (0.5, 0.125):
        ctx = context(teacher, dataset, {"distillation": {"widthRatio": ratio, "epochs": 1}}, tmp_path / str(ratio))
        built = student(ctx)
        assert [block[0].out_features for block in built.module.body.blocks] == [round(w * ratio) for w in widths]


def test_alpha_weighs_the_teachers_soft_targets_against_the_labels(teacher, dataset, tmp_path):
    flipped = 1 - dataset["y"][:ROWS]
    holdout = dataset["x_holdout"][:4000]

    def predictions(alpha: float, temperature: float, y, name: str) -> np.ndarray:
        spec = {"distillation": {"alpha": alpha, "temperature": temperature, "epochs": 1, "widthRatio": 0.5}}
        return student(context(teacher, dataset, spec, tmp_path / name, y)).predict(holdout)

    # A term of weight 0 adds exactly nothing to the gradients, so a field
    # the loss ignores leaves the student identical to the last bit.
    only_teacher = predictions(1.0, 4.0, None, "alpha-1")
    assert np.array_equal(only_teacher, predictions(1.0, 4.0, flipped, "alpha-1-flipped-labels"))
    only_labels = predictions(0.0, 4.0, None, "alpha-0")
    assert np.array_equal(only_labels, predictions(0.0, 0.05, None, "alpha-0-cold-teacher"))
    assert not np.allclose(only_teacher, only_labels, atol=1e-3)


def test_temperature_softens_the_teachers_logits(teacher, dataset, tmp_path):
    holdout = dataset["x_holdout"][:4000]
    with torch.no_grad():
        reference = teacher(torch.from_numpy(holdout)).numpy().reshape(-1)

    def gap(temperature: float) -> float:
        spec = {"distillation": {"temperature": temperature, "alpha": 1.0, "epochs": 2, "widthRatio": 0.5}}
        built = student(context(teacher, dataset, spec, tmp_path / str(temperature)))
        return float(np.mean(np.abs(built.predict(holdout) - reference)))

    # Near zero the soft targets are the teacher's hard decisions: the
    # student learns which side of the threshold a row is on, not how sure
    # the teacher is. Warm targets carry the teacher's confidence too.
    cold, warm = gap(0.05), gap(8.0)
    assert warm < cold / 2
