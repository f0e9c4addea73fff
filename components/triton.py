"""Triton model repositories for a model, with dynamic batching and instance
groups chosen from its measured latency profile.

Triton's Model Analyzer finds these settings by sweeping them under load.
We have the profile already (latency per batch size from the optimisation
benchmark), so the choice is made from it directly:

- preferred batch sizes: the profiled sizes whose p99 latency leaves at
  least half of the SLO for queueing and whose throughput is within 80% of
  the best such size; these are the batches worth waiting for;
- max queue delay: long enough to gather the largest preferred batch at
  the rate one instance drains them, but never more than half the SLO
  headroom left after computing it, nor more than a few single-row
  computations (measured here: at low concurrency a longer wait only adds
  latency, since no second request arrives to batch with);
- instances: on CPU one per core (each instance runs one thread), on GPU two
  so that copies overlap compute.

The python backend (what runs here, in tritonserver from nvidia-pytriton)
gets a model.py that concatenates every request of a dynamic batch into one
onnxruntime call; real clusters get the onnxruntime backend's config.

Input and output follow the version's signature (kubeloop.api.signature):
`features` FP32 [n_inputs], and `probability` [1], `probabilities` [C] or
`value` [1] by task. model.py reads the tensor names from the config Triton
hands it, so one model.py serves every task (and versions registered before
signatures existed).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from kubeloop.api.constants import MAX_REQUEST_ROWS
from kubeloop.api.signature import ModelSignature

BACKENDS = ("python", "onnxruntime")
DEVICES = ("cpu", "gpu")
GPU_INSTANCES = 2
"""Instances per GPU: two, so one copies while the other computes."""


@dataclass(frozen=True)
class BatchingPlan:
    max_batch_size: int
    """The largest batch size profiled (the config accepts up to MAX_REQUEST_ROWS)."""
    preferred_batch_sizes: tuple[int, ...]
    max_queue_delay_us: int
    instances: int
    kind: str
    why: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> "BatchingPlan":
        return cls(**{**data, "preferred_batch_sizes": tuple(data["preferred_batch_sizes"])})


def plan_batching(profile: dict[int, tuple[float, float]], slo_ms: float, device: str, cpus: int) -> BatchingPlan:
    """Dynamic batching and instance count from a latency profile (pure).

    profile maps batch size -> (p50 ms, p99 ms) of one model instance.
    """
    sizes = sorted(profile)
    throughput = {b: b / profile[b][0] * 1000 for b in sizes}  # rows per second
    within = [b for b in sizes if profile[b][1] <= slo_ms / 2] or sizes[:1]
    best = max(throughput[b] for b in within)
    preferred = tuple(b for b in within if b > 1 and throughput[b] >= 0.8 * best)
    largest = max(within)
    compute_ms = profile[largest][1]
    # Time to gather `largest` requests if they arrive as fast as one
    # instance could serve them one by one.
    fill_ms = largest * profile[sizes[0]][0]
    headroom_ms = max(0.0, slo_ms - compute_ms)
    cap_ms = max(4 * profile[sizes[0]][0], 0.1)
    delay_us = int(max(50.0, min(fill_ms, headroom_ms / 2, cap_ms) * 1000))
    instances = GPU_INSTANCES if device == "gpu" else max(1, min(cpus, 4))
    why = (f"p99 {compute_ms:.3f} ms at batch {largest} leaves {headroom_ms:.2f} ms of a {slo_ms} ms SLO; "
           f"best throughput {best:,.0f} rows/s; preferred {list(preferred) or 'none'}; "
           f"{instances} {'GPU' if device == 'gpu' else 'CPU'} instance(s)")
    return BatchingPlan(max(sizes), preferred, delay_us, instances, "KIND_GPU" if device == "gpu" else "KIND_CPU", why)


def build_config(name: str, signature: ModelSignature, plan: BatchingPlan | None, backend: str) -> mc.ModelConfig:
    """The model's config.pbtxt; without a plan, batching stays off (and the
    batch dimension is spelled out as -1)."""
    config = mc.ModelConfig(name=name, max_batch_size=max(plan.max_batch_size, MAX_REQUEST_ROWS) if plan else 0)
    if backend == "python":
        config.backend = "python"
    else:
        config.platform = "onnxruntime_onnx"
    inp = config.input.add()
    inp.name, inp.data_type = signature.input_name, mc.TYPE_FP32
    inp.dims.extend([signature.n_inputs] if plan else [-1, signature.n_inputs])
    out = config.output.add()
    out.name, out.data_type = signature.output_name, mc.TYPE_FP32
    out.dims.extend([signature.n_outputs] if plan else [-1, signature.n_outputs])
    group = config.instance_group.add()
    group.count = plan.instances if plan else 1
    group.kind = mc.ModelInstanceGroup.KIND_GPU if plan and plan.kind == "KIND_GPU" else mc.ModelInstanceGroup.KIND_CPU
    if plan and plan.preferred_batch_sizes:
        config.dynamic_batching.preferred_batch_size.extend(plan.preferred_batch_sizes)
        config.dynamic_batching.max_queue_delay_microseconds = plan.max_queue_delay_us
    elif plan:
        config.dynamic_batching.max_queue_delay_microseconds = plan.max_queue_delay_us
    return config


def for_device(config: mc.ModelConfig, device: str) -> mc.ModelConfig:
    """The config with its instances on the device the version is served on.
    A registered config carries the kind of the device it was profiled on,
    which need not be where placement puts it (a CPU-profiled version placed
    on a MIG slice would otherwise leave the GPU idle)."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device}: expected one of {', '.join(DEVICES)}")
    config = mc.ModelConfig.FromString(config.SerializeToString())
    groups = list(config.instance_group) or [mc.ModelInstanceGroup(count=1)]
    config.ClearField("instance_group")
    for group in groups:
        placed = config.instance_group.add()
        placed.CopyFrom(group)
        placed.ClearField("gpus")
        if device == "gpu":
            placed.kind, placed.count = mc.ModelInstanceGroup.KIND_GPU, GPU_INSTANCES
        else:
            placed.kind = mc.ModelInstanceGroup.KIND_CPU
    return config


MODEL_PY = '''"""Triton python-backend model generated by kubeloop: one onnxruntime call
per dynamic batch (the requests' rows are concatenated, then split back).
Tensor names and the output's width come from the model's config.pbtxt."""

import json
import os
import site

# The backend's embedded interpreter ignores PYTHONPATH; a local tritonserver
# names the environment that holds numpy and onnxruntime here instead.
if os.environ.get("KUBELOOP_SITE_PACKAGES"):
    site.addsitedir(os.environ["KUBELOOP_SITE_PACKAGES"])

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(os.environ.get("KUBELOOP_ORT_THREADS", "1"))
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        config = json.loads(args["model_config"])
        self.input = config["input"][0]["name"]
        self.output = config["output"][0]["name"]
        self.width = int(config["output"][0]["dims"][-1])
        # The ONNX graph's own input name: read, not assumed.
        self.onnx_input = self.session.get_inputs()[0].name

    def execute(self, requests):
        inputs = [pb_utils.get_input_tensor_by_name(r, self.input).as_numpy() for r in requests]
        sizes = [len(x) for x in inputs]
        batch = np.concatenate(inputs).astype(np.float32, copy=False)
        answers = self.session.run(None, {self.onnx_input: batch})[0].reshape(-1, self.width)
        responses, start = [], 0
        for size in sizes:
            out = pb_utils.Tensor(self.output, answers[start:start + size])
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
            start += size
        return responses
'''


def write_repository(root: Path, name: str, onnx_path: Path, signature: ModelSignature, plan: BatchingPlan | None,
                     backend: str, version: int = 1) -> Path:
    """<root>/<name>/config.pbtxt and <root>/<name>/<version>/ with the model."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown Triton backend {backend}")
    model_dir = root / name
    version_dir = model_dir / str(version)
    version_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(onnx_path, version_dir / "model.onnx")
    if backend == "python":
        (version_dir / "model.py").write_text(MODEL_PY)
    (model_dir / "config.pbtxt").write_text(text_format.MessageToString(build_config(name, signature, plan, backend)))
    return model_dir
