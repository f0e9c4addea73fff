"""Dynamic batching from a latency profile, and the config.pbtxt it gives for
each task's signature (pure builders; no backend)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from kubeloop.api.constants import MAX_REQUEST_ROWS
from kubeloop.api.signature import ModelSignature
from kubeloop.components.triton import build_config, for_device, plan_batching

# An overhead-bound model: a 32-row batch costs little more than one row.
PROFILE = {1: (0.05, 0.08), 8: (0.06, 0.10), 32: (0.09, 0.15)}


def test_overhead_bound_model_prefers_large_batches_and_waits_to_fill_them():
    plan = plan_batching(PROFILE, slo_ms=5.0, device="cpu", cpus=2)
    assert plan.preferred_batch_sizes == (32,)
    assert plan.max_batch_size == 32
    # Filling 32 slots would take 1.6 ms; waiting is capped at four single-row calls.
    assert plan.max_queue_delay_us == 200
    assert plan.instances == 2 and plan.kind == "KIND_CPU"


def test_a_tight_slo_shortens_the_wait_and_drops_slow_batches():
    plan = plan_batching(PROFILE, slo_ms=0.25, device="gpu", cpus=16)
    assert plan.preferred_batch_sizes == (8,)
    assert plan.max_queue_delay_us == 75
    assert plan.instances == 2 and plan.kind == "KIND_GPU"


# One signature per task: (signature, output name, output width).
SIGNATURES = {
    "binary": (ModelSignature(feature_columns=[f"f{i}" for i in range(18)], threshold=0.3), "probability", 1),
    "multiclass": (ModelSignature(task="multiclass", feature_columns=["a", "b", "c", "d"],
                                  classes=["low", "mid", "high"]), "probabilities", 3),
    "regression": (ModelSignature(task="regression", feature_columns=["a", "b"]), "value", 1),
}


@pytest.mark.parametrize("task", sorted(SIGNATURES))
def test_config_parses_as_a_triton_model_config_with_the_signatures_tensors(task):
    signature, output, width = SIGNATURES[task]
    plan = plan_batching(PROFILE, slo_ms=5.0, device="cpu", cpus=2)
    text = text_format.MessageToString(build_config("m", signature, plan, "python"))
    parsed = text_format.Parse(text, mc.ModelConfig())
    # Batches of 32 are what the batcher gathers; a caller may send more rows.
    assert parsed.backend == "python" and plan.max_batch_size == 32 and parsed.max_batch_size == MAX_REQUEST_ROWS
    assert list(parsed.dynamic_batching.preferred_batch_size) == [32]
    assert [(i.name, i.data_type, list(i.dims)) for i in parsed.input] == [
        ("features", mc.TYPE_FP32, [signature.n_inputs])]
    assert [(o.name, o.data_type, list(o.dims)) for o in parsed.output] == [(output, mc.TYPE_FP32, [width])]
    ort = build_config("m", signature, plan, "onnxruntime")
    assert ort.platform == "onnxruntime_onnx" and not ort.backend
    assert ort.output[0].name == output


@pytest.mark.parametrize("task", sorted(SIGNATURES))
def test_without_a_plan_batching_is_off_and_the_batch_dimension_is_explicit(task):
    signature, output, width = SIGNATURES[task]
    config = build_config("m", signature, None, "python")
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [-1, signature.n_inputs]
    assert (config.output[0].name, list(config.output[0].dims)) == (output, [-1, width])


def test_the_python_backend_stub_runs_in_the_serving_environment(tmp_path):
    """The stub's interpreter takes its prefix from the first python on PATH;
    an active virtualenv there once put its numpy under model.py."""
    from kubeloop.serving.runtime import TritonRuntime

    site = tmp_path / ".venv-serving" / "lib" / "python3.11" / "site-packages"
    env = TritonRuntime(site).env()
    assert env["PATH"].split(":")[0] == str(tmp_path / ".venv-serving" / "bin")
    assert env["VIRTUAL_ENV"] == str(tmp_path / ".venv-serving") and env["KUBELOOP_SITE_PACKAGES"] == str(site)


@pytest.mark.parametrize("profiled_on, device, kind, count", [
    ("cpu", "gpu", mc.ModelInstanceGroup.KIND_GPU, 2),
    ("gpu", "gpu", mc.ModelInstanceGroup.KIND_GPU, 2),
    ("cpu", "cpu", mc.ModelInstanceGroup.KIND_CPU, 2),
    ("gpu", "cpu", mc.ModelInstanceGroup.KIND_CPU, 2),
])
def test_instances_follow_the_device_the_version_is_placed_on(profiled_on, device, kind, count):
    """A version optimised on a CPU and placed on a MIG slice runs on the GPU
    (before: a CPU instance group in a GPU Pod); batching is left as profiled."""
    plan = plan_batching(PROFILE, slo_ms=5.0, device=profiled_on, cpus=2)
    config = build_config("m", SIGNATURES["binary"][0], plan, "onnxruntime")
    config.instance_group[0].gpus.append(3)
    placed = for_device(config, device)
    assert [(g.kind, g.count, list(g.gpus)) for g in placed.instance_group] == [(kind, count, [])]
    assert placed.dynamic_batching == config.dynamic_batching
    assert config.instance_group[0].gpus == [3], "the input is not changed"


def test_an_unknown_device_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="unknown device tpu: expected one of cpu, gpu"):
        for_device(mc.ModelConfig(name="m"), "tpu")
