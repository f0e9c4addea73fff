"""Faster variants of a trained network, one per technique.

Each variant runs in the runtime the technique belongs to (torch eager,
onnxruntime, or torch.compile), so the benchmark measures what the technique
really buys. A variant that can be exported to ONNX can be served by Triton
(onnxruntime backend, or the python backend running onnxruntime).

Most techniques work on any module (quantisation, ONNX, unstructured
pruning, compilation); those that rebuild the architecture (structured
pruning, distillation into a narrower student) need the built-in perceptron
and say so for a user's module instead of guessing at its layers.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch
from torch import nn

from kubeloop.components.model import MLP, TaskModel, build_model, export_onnx, export_torchscript
from kubeloop.components.training import Distillation, TrainSettings, train

if TYPE_CHECKING:  # pydantic only for the annotation: the GPU benchmark builds variants without it
    from kubeloop.api.optimization import OptimizedModelSpec

log = logging.getLogger(__name__)
Predict = Callable[[np.ndarray], np.ndarray]
THREADS = 1
"""Threads each runtime computes with (onnxruntime sessions here, torch while
components.benchmark measures): the comparison is per core."""


class NotBuilt(Exception):
    """The technique cannot run here; the message says why."""


@dataclass
class BuildContext:
    source: TaskModel
    x_train: np.ndarray
    y_train: np.ndarray
    spec: OptimizedModelSpec
    workdir: Path
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 0

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]


@dataclass
class Variant:
    technique: str
    runtime: str
    predict: Predict
    artifact: Path
    """The variant in its own serialised form (its size is reported)."""
    onnx: Path | None = None
    """The form Triton serves, when there is one."""
    note: str = ""
    module: nn.Module | None = None


def rows(out: np.ndarray) -> np.ndarray:
    """One number per row ([n]) for single-output models, [n, C] otherwise."""
    return out.reshape(len(out), -1) if out.ndim == 2 and out.shape[1] > 1 else out.reshape(-1)


def torch_predict(model: nn.Module, device: torch.device, dtype: torch.dtype = torch.float32) -> Predict:
    model = model.eval()

    def predict(x: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = model(torch.from_numpy(x).to(device=device, dtype=dtype))
            return rows(out.float().cpu().numpy())

    return predict


def ort_session(path: Path, device: torch.device, optimized: Path | None = None):  # noqa: ANN201
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = THREADS
    if optimized:
        options.optimized_model_filepath = str(optimized)
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device.type == "cuda" else ["CPUExecutionProvider"]
    return ort.InferenceSession(str(path), options, providers=providers)


def ort_predict(session) -> Predict:  # noqa: ANN001 - onnxruntime.InferenceSession
    def predict(x: np.ndarray) -> np.ndarray:
        return rows(session.run(None, {"features": x.astype(np.float32, copy=False)})[0])

    return predict


def _onnx_of(model: TaskModel, ctx: BuildContext, name: str) -> Path:
    return export_onnx(copy.deepcopy(model).cpu().float(), ctx.workdir / f"{name}.onnx")


def _torch_variant(technique: str, model: TaskModel, ctx: BuildContext, note: str = "") -> Variant:
    model = model.to(ctx.device).eval()
    artifact = export_torchscript(copy.deepcopy(model).cpu(), ctx.n_features, ctx.workdir / f"{technique}.pt")
    return Variant(technique, "torch", torch_predict(model, ctx.device), artifact,
                   onnx=_onnx_of(model, ctx, technique), note=note, module=model)


def _finetune_settings(ctx: BuildContext, epochs: int) -> TrainSettings:
    return TrainSettings(epochs=max(1, epochs), batch_size=512, learning_rate=1e-3, seed=ctx.seed)


def _mlp(ctx: BuildContext, technique: str) -> MLP:
    """The source's built-in perceptron; a user's module cannot be rebuilt narrower."""
    if not isinstance(ctx.source.body, MLP):
        raise NotBuilt(f"not applicable: {technique} rebuilds the built-in perceptron's layers, and this model "
                       f"is a user module ({ctx.source.architecture.factory})")
    return ctx.source.body


def _narrower(ctx: BuildContext, widths: list[int]) -> TaskModel:
    """A fresh perceptron of the source's task and inputs with other widths,
    the source's standardisation copied."""
    body = _mlp(ctx, "a narrower network")
    dropout = next((m.p for m in body.modules() if isinstance(m, nn.Dropout)), 0.0)
    arch = ctx.source.architecture
    # Its first weights come from the run's seed, not from whatever drew from
    # torch's generator before: the same spec builds the same student.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ctx.seed)
        model = build_model(replace(arch, parameters={"hidden_units": widths, "dropout": dropout}))
    model.load_state_dict({k: v for k, v in ctx.source.state_dict().items() if not k.startswith("body.")},
                          strict=False)
    return model


def _widths(body: MLP) -> list[int]:
    return [block[0].out_features for block in body.blocks]


# -- techniques -------------------------------------------------------------

def source(ctx: BuildContext) -> Variant:
    """The unmodified model in fp32 eager PyTorch: the baseline."""
    return _torch_variant("source", copy.deepcopy(ctx.source), ctx, "fp32 eager")


def dynamic_int8(ctx: BuildContext) -> Variant:
    """Linear weights stored as int8, activations quantised per batch (PyTorch)."""
    if ctx.device.type != "cpu":
        raise NotBuilt("PyTorch dynamic quantisation runs on CPU only")
    model = torch.ao.quantization.quantize_dynamic(copy.deepcopy(ctx.source).eval(), {nn.Linear},
                                                   dtype=torch.qint8)
    artifact = ctx.workdir / "dynamic-int8.pt"
    torch.jit.save(torch.jit.trace(model, torch.zeros(2, ctx.n_features), check_trace=False), str(artifact))
    return Variant("dynamic-int8", "torch", torch_predict(model, ctx.device), artifact,
                   note="no ONNX form: serve with Triton's PyTorch backend", module=model)


def onnx(ctx: BuildContext) -> Variant:
    """ONNX with onnxruntime's full graph optimisation (fusions, constant folding)."""
    path = _onnx_of(ctx.source, ctx, "onnx")
    optimized = ctx.workdir / "onnx-optimized.onnx"
    session = ort_session(path, ctx.device, optimized)
    return Variant("onnx", "onnxruntime", ort_predict(session), optimized, onnx=optimized,
                   note="ORT_ENABLE_ALL")


def onnx_int8(ctx: BuildContext) -> Variant:
    """ONNX with int8 weights, activations quantised at run time (onnxruntime)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32 = _onnx_of(ctx.source, ctx, "onnx-fp32")
    path = ctx.workdir / "onnx-int8.onnx"
    quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8)
    return Variant("onnx-int8", "onnxruntime", ort_predict(ort_session(path, ctx.device)), path, onnx=path,
                   note="dynamic int8")


def static_int8(ctx: BuildContext) -> Variant:
    """Static post-training int8 (QDQ), activation ranges calibrated on
    training rows from the feature store."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    rows = ctx.x_train[: ctx.spec.calibration_samples].astype(np.float32)

    class Calibration(CalibrationDataReader):
        def __init__(self):
            self.batches = iter(np.array_split(rows, max(1, len(rows) // 256)))

        def get_next(self):  # noqa: ANN202
            batch = next(self.batches, None)
            return None if batch is None else {"features": batch}

    fp32 = _onnx_of(ctx.source, ctx, "static-fp32")
    path = ctx.workdir / "static-int8.onnx"
    # Only the matrix products are quantised: their inputs are the normalised
    # activations. Quantising the raw feature vector with one scale would
    # flatten small-valued features (0/1 flags next to credit limits).
    quantize_static(str(fp32), str(path), Calibration(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    op_types_to_quantize=["Gemm", "MatMul"])
    return Variant("static-int8", "onnxruntime", ort_predict(ort_session(path, ctx.device)), path, onnx=path,
                   note=f"calibrated on {len(rows)} training rows")


def structured_pruning(ctx: BuildContext) -> Variant:
    """Remove the hidden units with the smallest weights (the layers really
    shrink), then fine-tune."""
    sparsity = ctx.spec.pruning.sparsity
    src = _mlp(ctx, "structured-pruning")
    widths = _widths(src)
    keep = [max(1, int(round(w * (1 - sparsity)))) for w in widths]
    pruned = _narrower(ctx, keep)
    previous = torch.arange(ctx.n_features)
    with torch.no_grad():
        for i, (block, new) in enumerate(zip(src.blocks, pruned.body.blocks, strict=True)):
            weight, bias = block[0].weight[:, previous], block[0].bias
            chosen = torch.argsort(weight.norm(dim=1), descending=True)[: keep[i]].sort().values
            new[0].weight.copy_(weight[chosen])
            new[0].bias.copy_(bias[chosen])
            previous = chosen
        pruned.body.head.weight.copy_(src.head.weight[:, previous])
        pruned.body.head.bias.copy_(src.head.bias)
    tuned = train(ctx.x_train, ctx.y_train, None, None, _finetune_settings(ctx, ctx.spec.pruning.finetune_epochs),
                  model=pruned).model
    return _torch_variant("structured-pruning", tuned, ctx, f"widths {widths} -> {keep}")


def unstructured_pruning(ctx: BuildContext) -> Variant:
    """Zero the smallest weights across every linear layer (L1), fine-tune
    with the masks held, make them permanent. Dense kernels gain no speed
    from zeros: the sparsity is reported, the latency is what it is."""
    from torch.nn.utils import prune

    model = copy.deepcopy(ctx.source)
    layers = [(m, "weight") for m in model.body.modules() if isinstance(m, nn.Linear)]
    if not layers:
        raise NotBuilt("not applicable: the model has no linear layers to prune")
    prune.global_unstructured(layers, pruning_method=prune.L1Unstructured, amount=ctx.spec.pruning.sparsity)
    model = train(ctx.x_train, ctx.y_train, None, None, _finetune_settings(ctx, ctx.spec.pruning.finetune_epochs),
                  model=model).model
    for module, name in layers:
        prune.remove(module, name)
    zeros = sum(int((m.weight == 0).sum()) for m, _ in layers)
    total = sum(m.weight.numel() for m, _ in layers)
    return _torch_variant("unstructured-pruning", model, ctx, f"sparsity {zeros / total:.2f}")


def distillation(ctx: BuildContext) -> Variant:
    """A narrower student trained on the teacher's softened outputs and the labels."""
    settings = ctx.spec.distillation
    widths = [max(2, int(round(w * settings.width_ratio))) for w in _widths(_mlp(ctx, "distillation"))]
    student = _narrower(ctx, widths)
    result = train(ctx.x_train, ctx.y_train, None, None,
                   TrainSettings(epochs=settings.epochs, batch_size=512, learning_rate=3e-3, seed=ctx.seed),
                   model=student, distillation=Distillation(ctx.source, settings.temperature, settings.alpha))
    return _torch_variant("distillation", result.model, ctx,
                          f"student {widths}, T={settings.temperature}, alpha={settings.alpha}")


def torch_compile(ctx: BuildContext) -> Variant:
    """torch.compile (inductor); compiled on the first call, which the
    benchmark's warm-up absorbs."""
    model = copy.deepcopy(ctx.source).to(ctx.device).eval()
    compiled = torch.compile(model, mode="max-autotune-no-cudagraphs" if ctx.device.type == "cuda" else "default")
    artifact = export_torchscript(copy.deepcopy(ctx.source), ctx.n_features, ctx.workdir / "torch-compile.pt")
    return Variant("torch-compile", "torch-compile", torch_predict(compiled, ctx.device), artifact,
                   note="no ONNX form: compiled at load time", module=model)


def half(dtype: torch.dtype, name: str) -> Callable[[BuildContext], Variant]:
    def build(ctx: BuildContext) -> Variant:
        if ctx.device.type != "cuda":
            raise NotBuilt(f"{name} needs a GPU where the pipeline runs")
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            raise NotBuilt("this GPU has no bf16 support")
        model = copy.deepcopy(ctx.source).to(ctx.device, dtype).eval()
        artifact = ctx.workdir / f"{name}.pt"
        torch.save(model.state_dict(), artifact)
        return Variant(name, "torch", torch_predict(model, ctx.device, dtype), artifact,
                       onnx=None, note=f"{name} weights and activations", module=model)

    return build


def sparsity_2to4(ctx: BuildContext) -> Variant:
    """2:4 semi-structured sparsity on sparse tensor cores (fp16)."""
    if ctx.device.type != "cuda":
        raise NotBuilt("sparsity-2to4 needs a GPU where the pipeline runs")
    from torch.sparse import to_sparse_semi_structured

    model = copy.deepcopy(ctx.source).to(ctx.device, torch.float16).eval()
    try:
        for linear in [m for m in model.body.modules() if isinstance(m, nn.Linear)][:-1]:
            w = linear.weight.detach()
            groups = w.reshape(-1, 4)
            mask = torch.zeros_like(groups, dtype=torch.bool)
            mask.scatter_(1, groups.abs().topk(2, dim=1).indices, True)
            linear.weight = nn.Parameter(to_sparse_semi_structured((groups * mask).reshape(w.shape)))
    except (RuntimeError, ValueError) as exc:
        raise NotBuilt(f"2:4 sparsity does not apply to these layer shapes: {exc}") from exc
    artifact = ctx.workdir / "sparsity-2to4.pt"
    torch.save(ctx.source.state_dict(), artifact)
    return Variant("sparsity-2to4", "torch", torch_predict(model, ctx.device, torch.float16), artifact,
                   note="2:4 semi-structured, fp16", module=model)


def tensorrt(precision: str) -> Callable[[BuildContext], Variant]:
    """A TensorRT engine through torch_tensorrt (GPU only; not installable
    here, so untested in this repository's CI)."""

    def build(ctx: BuildContext) -> Variant:
        if ctx.device.type != "cuda":
            raise NotBuilt(f"tensorrt-{precision} needs a GPU where the pipeline runs")
        try:
            import torch_tensorrt
        except ImportError:
            raise NotBuilt("TensorRT (torch_tensorrt) is not installed where the pipeline runs") from None
        if precision == "int8":
            raise NotBuilt("TensorRT int8 needs a calibrated engine: the static-int8 variant's QDQ ONNX is "
                           "what Triton's TensorRT backend builds one from")
        model = copy.deepcopy(ctx.source).to(ctx.device).eval()
        largest = max(ctx.spec.batch_sizes)
        engine = torch_tensorrt.compile(
            model, ir="dynamo", enabled_precisions={torch.half},
            inputs=[torch_tensorrt.Input(min_shape=(1, ctx.n_features), opt_shape=(largest, ctx.n_features),
                                         max_shape=(largest, ctx.n_features), dtype=torch.float32)])
        artifact = ctx.workdir / f"tensorrt-{precision}.ep"
        torch_tensorrt.save(engine, str(artifact), inputs=[torch.zeros(largest, ctx.n_features, device=ctx.device)])
        return Variant(f"tensorrt-{precision}", "tensorrt", torch_predict(engine, ctx.device), artifact,
                       note="TensorRT fp16 engine", module=model)

    return build


BUILDERS: dict[str, Callable[[BuildContext], Variant]] = {
    "dynamic-int8": dynamic_int8,
    "static-int8": static_int8,
    "structured-pruning": structured_pruning,
    "unstructured-pruning": unstructured_pruning,
    "distillation": distillation,
    "onnx": onnx,
    "onnx-int8": onnx_int8,
    "torch-compile": torch_compile,
    "fp16": half(torch.float16, "fp16"),
    "bf16": half(torch.bfloat16, "bf16"),
    "sparsity-2to4": sparsity_2to4,
    "tensorrt-fp16": tensorrt("fp16"),
    "tensorrt-int8": tensorrt("int8"),
}
