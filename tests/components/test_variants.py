"""Every CPU technique builds a working variant of a trained model."""

from __future__ import annotations

import numpy as np
import pytest

from sklearn.metrics import roc_auc_score

from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.api.signature import ModelSignature
from kubeloop.components.evaluation import evaluate
from kubeloop.components.model import Architecture
from kubeloop.components.optimize import measure_variants
from kubeloop.components.training import TrainSettings, train
from kubeloop.components.triton import plan_batching, write_repository
from kubeloop.components.variants import BUILDERS, BuildContext, NotBuilt, ort_predict, ort_session, source

CPU_TECHNIQUES = ["dynamic-int8", "static-int8", "onnx", "onnx-int8", "structured-pruning",
                  "unstructured-pruning", "distillation", "torch-compile"]


@pytest.fixture(scope="module")
def context(dataset, tmp_path_factory):
    model = train(dataset["x"], dataset["y"], None, None, TrainSettings(epochs=2, batch_size=512,
                                                                        learning_rate=0.003, seed=3)).model
    spec = OptimizedModelSpec.model_validate({"source": {"name": "m", "version": "1"},
                                              "pruning": {"sparsity": 0.5, "finetuneEpochs": 1},
                                              "distillation": {"epochs": 2}})
    return BuildContext(model, dataset["x"], dataset["y"], spec, tmp_path_factory.mktemp("variants"))


@pytest.mark.parametrize("technique", CPU_TECHNIQUES)
def test_each_technique_builds_a_model_that_still_works(context, dataset, technique):
    variant = BUILDERS[technique](context)
    scores = variant.predict(dataset["x_holdout"][:500])
    assert scores.shape == (500,) and np.all((scores >= 0) & (scores <= 1))
    assert variant.artifact.exists()
    assert (variant.onnx is not None) == (technique not in ("dynamic-int8", "torch-compile"))
    assert roc_auc_score(dataset["y_holdout"], variant.predict(dataset["x_holdout"])) > 0.7


def test_the_source_onnx_matches_eager_pytorch(context, dataset):
    variant = source(context)
    served = ort_predict(ort_session(variant.onnx, context.device))
    x = dataset["x_holdout"][:1000]
    assert np.allclose(served(x), variant.predict(x), atol=1e-5)


def test_pruning_shrinks_and_sparsifies(context):
    structured = BUILDERS["structured-pruning"](context)
    assert [b[0].out_features for b in structured.module.body.blocks] == [32, 16]
    unstructured = BUILDERS["unstructured-pruning"](context)
    assert unstructured.note == "sparsity 0.50"
    student = BUILDERS["distillation"](context)
    assert [b[0].out_features for b in student.module.body.blocks] == [16, 8]


@pytest.mark.parametrize("technique", ["fp16", "bf16", "sparsity-2to4", "tensorrt-fp16"])
def test_gpu_techniques_say_why_they_cannot_run_on_cpu(context, technique):
    with pytest.raises(NotBuilt, match="GPU"):
        BUILDERS[technique](context)


def test_measurements_and_a_triton_repository(context, dataset, tmp_path):
    rows, variants = measure_variants(context, ["onnx", "tensorrt-int8"], [1, 8],
                                      lambda y, outputs: evaluate("binary", y, outputs)["auc"],
                                      dataset["x_holdout"], dataset["y_holdout"])
    by = {r.technique: r for r in rows}
    assert by["tensorrt-int8"].error and by["onnx"].servable
    for p50, p99 in by["onnx"].latency.values():  # measured interleaved with the source, each with an interval
        assert 0 < p50.low <= p50.value <= p50.high and 0 < p99.low <= p99.value <= p99.high
    plan = plan_batching(by["onnx"].profile, slo_ms=5, device="cpu", cpus=2)
    signature = ModelSignature(feature_columns=[f"f{i}" for i in range(context.n_features)], threshold=0.5)
    model_dir = write_repository(tmp_path, "fraud", variants["onnx"].onnx, signature, plan, "python")
    assert (model_dir / "1" / "model.onnx").exists() and (model_dir / "1" / "model.py").exists()
    assert "max_queue_delay_microseconds" in (model_dir / "config.pbtxt").read_text()


SPEC = OptimizedModelSpec.model_validate({"source": {"name": "m", "version": "1"},
                                         "pruning": {"sparsity": 0.5, "finetuneEpochs": 1}, "distillation": {"epochs": 1}})


def test_techniques_that_rebuild_the_mlp_are_not_applicable_to_a_user_module(dataset, tmp_path):
    (tmp_path / "wide.py").write_text(
        "from torch import nn\n"
        "def build(n_inputs, n_outputs, width=32):\n"
        "    return nn.Sequential(nn.Linear(n_inputs, width), nn.GELU(), nn.Linear(width, n_outputs))\n")
    arch = Architecture("binary", dataset["x"].shape[1], 1, "wide:build", {}, str(tmp_path))
    model = train(dataset["x"], dataset["y"], None, None, TrainSettings(epochs=1, batch_size=512, seed=3),
                  architecture=arch).model
    ctx = BuildContext(model, dataset["x"], dataset["y"], SPEC, tmp_path / "v")
    ctx.workdir.mkdir()
    for technique in ("structured-pruning", "distillation"):
        with pytest.raises(NotBuilt, match=f"not applicable: {technique}.*user module \\(wide:build\\)"):
            BUILDERS[technique](ctx)
    for technique in ("onnx", "static-int8", "dynamic-int8", "unstructured-pruning"):
        assert BUILDERS[technique](ctx).predict(dataset["x_holdout"][:64]).shape == (64,)


def test_variants_of_a_multiclass_model_answer_a_probability_per_class(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 4, 2000)
    x = (rng.normal(0, 3, (4, 6))[y] + rng.normal(0, 1, (2000, 6))).astype(np.float32)
    settings = TrainSettings(epochs=3, batch_size=128, learning_rate=0.01, hidden_units=(32, 16), seed=1)
    model = train(x, y, None, None, settings, architecture=settings.builtin("multiclass", 6, 4)).model
    ctx = BuildContext(model, x, y, SPEC, tmp_path)
    for technique in ("onnx", "onnx-int8", "static-int8", "dynamic-int8", "structured-pruning", "distillation"):
        out = BUILDERS[technique](ctx).predict(x[:32])
        assert out.shape == (32, 4) and np.allclose(out.sum(1), 1, atol=1e-3), technique
