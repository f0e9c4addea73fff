"""Local CPU smoke of the GPU bench suite (tests/bench/gpu_suite.py): its quick
mode runs here, on this machine's CPU, as it would on a GPU machine that has
only torch, onnx, onnxruntime and numpy. It proves the suite's structure and
its CPU rows, never a GPU figure (those need a GPU: `make bench`)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.bench import gpu_suite

REPO = Path(__file__).resolve().parents[2]
MISSING_ON_GPU_MACHINES = ("pydantic", "pydantic_settings", "kopf", "kubernetes", "mlflow", "feast", "evidently",
                           "kfp", "tritonclient", "optuna", "boto3", "orjson", "tenacity", "rich")
"""kubeloop's dependencies that the GPU machines' image lacks (.library/device/KINDS.md), and rich, which
it has but the suite must not need."""

BLOCKER = f"""
import sys

class Missing:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {MISSING_ON_GPU_MACHINES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: not on the GPU machine)", name=name)

sys.meta_path.insert(0, Missing())
"""


@pytest.fixture(scope="module")
def standalone(tmp_path_factory) -> dict:
    """`python -m tests.bench.gpu_suite --quick` from the repository root, as
    on a GPU machine: no PYTHONPATH to the package (the suite's bootstrap
    finds it) and every module that machine lacks failing to import."""
    tmp = tmp_path_factory.mktemp("gpu-suite")
    (tmp / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(tmp)}
    done = subprocess.run([sys.executable, "-m", "tests.bench.gpu_suite", "--quick", "--json", str(tmp / "gpu.json")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return {"results": json.loads((tmp / "gpu.json").read_text()), "stdout": done.stdout}


def _finite_positive(figure: dict) -> bool:
    return all(math.isfinite(v) and v > 0 for v in [figure["median"], *figure["runs"]])


def test_every_row_is_there_and_gpu_rows_say_not_measured_without_a_gpu(standalone):
    """Both models, the four tables; without CUDA every GPU row says so
    instead of showing a CPU figure, and the CPU rows hold positive, finite
    ratios against a baseline of the same run."""
    results, gpu = standalone["results"], torch.cuda.is_available()
    assert set(results["cases"]) == {c.name for c in gpu_suite.CASES}
    for case in results["cases"].values():
        training = case["training"]
        assert training["backend"] == ("CPU" if not gpu else results["device"])
        assert all(_finite_positive(training[k]) and len(training[k]["runs"]) >= 5
                   for k in ("fp32", "autocast", "ratio"))
        inference = case["inference"]
        assert list(inference) == ["source", *gpu_suite.GPU_VARIANTS, *([] if gpu else gpu_suite.CPU_VARIANTS)]
        for name, row in inference.items():
            if name in gpu_suite.GPU_VARIANTS and not gpu:
                assert row == {"status": gpu_suite.NO_GPU}
            elif row["status"] == "measured":
                for figures in row["batches"].values():
                    assert _finite_positive(figures["speedup"]) and _finite_positive(figures["p50_ms"])
                    assert len(figures["speedup"]["runs"]) >= 5
        assert inference["source"]["status"] == "measured"
        if not gpu:
            assert inference["onnx-cpu"]["status"] == "measured"
        memory = case["memory"]
        assert memory["estimate_mib"] > memory["assumed_context_mib"]
        assert memory["measured"] == gpu_suite.NO_GPU if not gpu else memory["measured"]["peak_allocated_mib"] > 0
        pooled = case["pooled"]
        assert pooled["models"] == gpu_suite.POOLED_MODELS
        assert pooled["measured"] == gpu_suite.NO_GPU if not gpu else pooled["measured"]["allocated_per_model_mib"] > 0


def test_standalone_needs_none_of_what_a_gpu_machine_lacks(standalone):
    """It ran with those imports failing: plain-text tables (no rich), and the
    one figure whose module needs pydantic says so instead of failing."""
    out = standalone["stdout"]
    assert "GPU suite: training samples/s" in out and "GPU suite: pooled GPU memory" in out and "┏" not in out
    for case in standalone["results"]["cases"].values():
        assert case["memory"]["no_footprint_mib"] == "not read: kubeloop.gpu.placement needs pydantic"


def test_the_team_case_is_the_maintenance_examples_module():
    """The team row trains what examples/maintenance/trainingjob.yaml names."""
    spec = yaml.safe_load((REPO / "examples" / "maintenance" / "trainingjob.yaml").read_text())["spec"]
    team = next(c for c in gpu_suite.CASES if c.architecture)
    assert (team.task, team.architecture.factory, team.architecture.parameters) == (
        spec["task"], spec["model"]["factory"], spec["model"]["parameters"])
    assert Path(team.architecture.path) == REPO / "examples" / "maintenance" / "model"


def test_a_variant_that_breaks_on_first_use_is_reported_and_the_others_are_still_measured(monkeypatch, tmp_path):
    """A capture or compile that fails on one GPU (torch.compile without a
    compiler, a CUDA graph the driver refuses) costs that row only: it says
    why, and the source and every other variant keep their figures."""
    case = gpu_suite.CASES[0]
    x, y = gpu_suite.synthetic(case, 1024)
    size = gpu_suite.sizes(quick=True, gpu=False)
    settings = gpu_suite.TrainSettings(epochs=1, batch_size=256, seed=1)
    model = gpu_suite.train(x, y, None, None, settings, architecture=case.architecture).model
    torch.use_deterministic_algorithms(False)

    def broken(ctx):
        def predict(rows):
            raise RuntimeError("graph capture refused")
        return gpu_suite.Variant("broken", "torch", predict, tmp_path / "broken.pt")

    monkeypatch.setattr(gpu_suite, "CPU_VARIANTS", {**gpu_suite.CPU_VARIANTS, "broken": broken})
    rows = gpu_suite.inference(model, x, torch.device("cpu"), size, tmp_path)
    assert rows["broken"] == {"status": "failed: RuntimeError: graph capture refused"}
    assert rows["source"]["status"] == rows["onnx-cpu"]["status"] == "measured"
