"""Every task and any module: training, metrics, the exported signature and
the factory contract's errors, with real torch, onnxruntime and Feast (no
cluster; the e2e tests prove the same through the operator)."""

from __future__ import annotations

import textwrap

import numpy as np
import onnxruntime as ort
import pandas as pd
import pytest

from kubeloop.api.tasks import METRICS, PER_CLASS_PREFIX
from kubeloop.components.data import label_classes
from kubeloop.components.evaluation import evaluate
from kubeloop.components.model import (Architecture, FactoryError, build_model, export_onnx, load_model,
                                       save_model)
from kubeloop.components.training import TrainSettings, predict, train

SETTINGS = TrainSettings(epochs=12, batch_size=128, learning_rate=0.01, seed=3)


def blobs(n: int = 3000, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Separable clusters with large, shifted feature scales (standardisation must matter)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, n)
    centres = rng.normal(0, 3, (classes, 5))
    x = centres[y] + rng.normal(0, 1, (n, 5))
    return (x * [1, 10, 100, 0.1, 1000] + 50).astype(np.float32), y


def test_multiclass_learns_and_exports_class_probabilities(tmp_path):
    x, y = blobs()
    arch = SETTINGS.builtin("multiclass", 5, 3)
    result = train(x[:2400], y[:2400], None, None, SETTINGS, architecture=arch)
    probabilities = predict(result.model, x[2400:])
    assert probabilities.shape == (600, 3) and np.allclose(probabilities.sum(1), 1, atol=1e-5)
    metrics = evaluate("multiclass", y[2400:], probabilities, classes=["a", "b", "c"], top_k=2)
    assert metrics["accuracy"] > 0.9 and metrics["macro_f1"] > 0.9 and metrics["top_k_accuracy"] >= metrics["accuracy"]
    assert {f"{PER_CLASS_PREFIX}{c}" for c in "abc"} <= set(metrics) and set(METRICS["multiclass"]) <= set(metrics)
    onnx = export_onnx(result.model, tmp_path / "m.onnx")
    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["probabilities"]
    assert session.get_inputs()[0].name == "features"
    out = session.run(None, {"features": x[2400:2407]})[0]
    assert out.shape == (7, 3) and np.allclose(out, probabilities[:7], atol=1e-5)


def test_regression_learns_in_the_labels_units(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (3000, 4)).astype(np.float32)
    y = (1000 + 300 * x[:, 0] - 200 * x[:, 1] + rng.normal(0, 20, 3000)).astype(np.float32)
    result = train(x[:2400], y[:2400], None, None, SETTINGS, architecture=SETTINGS.builtin("regression", 4, 1))
    values = predict(result.model, x[2400:])
    metrics = evaluate("regression", y[2400:], values)
    assert values.shape == (600,) and set(metrics) >= set(METRICS["regression"])
    assert metrics["r2"] > 0.9 and metrics["rmse"] < 0.3 * y.std()
    session = ort.InferenceSession(str(export_onnx(result.model, tmp_path / "r.onnx")),
                                   providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["value"]
    assert np.allclose(session.run(None, {"features": x[2400:2405]})[0].reshape(-1), values[:5], rtol=1e-4)


def test_binary_metrics_cover_the_catalogue():
    rng = np.random.default_rng(2)
    y = rng.integers(0, 2, 500)
    p = np.clip(y * 0.6 + rng.uniform(0, 0.4, 500), 0, 1)
    assert set(METRICS["binary"]) <= set(evaluate("binary", y, p))


def user_module(folder, body: str) -> str:
    (folder / "teammodel.py").write_text(textwrap.dedent(body))
    return str(folder)


GOOD = """
    import torch
    from torch import nn

    class Gated(nn.Module):
        def __init__(self, n_inputs, n_outputs, width):
            super().__init__()
            self.value = nn.Linear(n_inputs, width)
            self.gate = nn.Linear(n_inputs, width)
            self.out = nn.Linear(width, n_outputs)

        def forward(self, x):
            return self.out(torch.tanh(self.value(x)) * torch.sigmoid(self.gate(x)))

    def build(n_inputs, n_outputs, width=16):
        return Gated(n_inputs, n_outputs, width)

    def wrong_shape(n_inputs, n_outputs):
        return nn.Linear(n_inputs, n_outputs + 2)

    def raises(n_inputs, n_outputs):
        raise RuntimeError("no GPU budget for this team")

    def not_a_module(n_inputs, n_outputs):
        return "a string"
"""


def test_a_user_factory_trains_saves_and_loads_without_pickle(tmp_path):
    folder = user_module(tmp_path, GOOD)
    x, y = blobs(classes=2)
    arch = Architecture("binary", 5, 1, "teammodel:build", {"width": 24}, folder)
    result = train(x[:2400], y[:2400].astype(np.float32), None, None, SETTINGS, architecture=arch)
    assert type(result.model.body).__name__ == "Gated"
    assert evaluate("binary", y[2400:], predict(result.model, x[2400:]))["auc"] > 0.9
    save_model(result.model, tmp_path / "saved")
    again = load_model(tmp_path / "saved")  # torch.load(weights_only=True): plain data and tensors only
    assert np.allclose(predict(again, x[:50]), predict(result.model, x[:50]))


@pytest.mark.parametrize(("factory", "message"), [
    ("nosuchmodule:build", "cannot import nosuchmodule"),
    ("teammodel:missing", "teammodel has no function missing"),
    ("teammodel:raises", "raised RuntimeError: no GPU budget"),
    ("teammodel:wrong_shape", "must answer [batch, 1]"),
    ("teammodel:not_a_module", "returned str, not a torch.nn.Module"),
])
def test_a_broken_factory_is_named_with_its_error(tmp_path, factory, message):
    folder = user_module(tmp_path, GOOD)
    with pytest.raises(FactoryError, match="spec.model.factory") as caught:
        build_model(Architecture("binary", 5, 1, factory, {}, folder))
    assert message in str(caught.value) and factory in str(caught.value)


@pytest.mark.parametrize(("task", "values", "message"), [
    ("binary", ["a", "b", "c"], "task binary needs labels 0 and 1"),
    ("regression", ["low", "high"], "task regression needs numeric labels"),
    ("multiclass", [1, 1, 1], "task multiclass needs 2 to"),
])
def test_a_label_of_the_wrong_kind_names_the_column(task, values, message):
    with pytest.raises(ValueError, match="spec.features.labels.column 'target'") as caught:
        label_classes(task, pd.Series(values * 10), "target")
    assert message in str(caught.value)


def test_multiclass_classes_keep_a_stable_order():
    assert label_classes("multiclass", pd.Series(["none", "bearing", "none", "overheat"]), "f") == \
        ["bearing", "none", "overheat"]
    assert label_classes("multiclass", pd.Series([10, 2, 1, 2]), "f") == ["1", "2", "10"]


def test_a_saved_model_holding_a_pickled_object_is_refused(tmp_path):
    """No pickle from artifact stores: state.pt is loaded with weights_only=True,
    so a file that would run code on unpickling is rejected, not executed."""
    import pickle

    import torch

    class Payload:
        def __reduce__(self):
            return (print, ("this would have run",))

    folder = tmp_path / "forged"
    folder.mkdir()
    torch.save({"architecture": Payload(), "state_dict": {}}, folder / "state.pt")
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        load_model(folder)
