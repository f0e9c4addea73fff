"""GPU suite: what a GPU buys kubeloop's models, measured against fp32 in the same run.

    python -m tests.bench.gpu_suite [--quick] [--json PATH]   # standalone, e.g. on a GPU machine
    python -m tests.bench gpu [--quick]                       # within `make bench`

Four tables, for the built-in MLP (the fraud example's width: 20 features,
binary) and a team module (examples/maintenance's residual MLP: 13 features,
4 classes), on synthetic rows of those shapes:

1. training: samples/s of the project's trainer (components.training.train)
   in fp32 and with autocast at the precision pick_precision gives the GPU
   (bf16 on Ampere and newer), alternating in every run; on a CPU, fp32
   against bf16 autocast, labelled CPU.
2. inference: the optimiser's GPU variants (fp16, bf16, torch.compile, its
   own builders), CUDA graphs and onnxruntime's CUDA provider (when the
   installed build has it) against the fp32 eager source, timed interleaved
   by components.benchmark; each figure the median of RUNS repeats with its
   spread. Without a GPU these rows say "not measured" and an onnxruntime
   CPU row proves the path.
3. GPU memory: a fresh process serving the fp32 model at the benchmark's
   batch sizes (allocator peaks, the whole process as NVML sees it, and the
   CUDA context that leaves), against the footprint placement plans MIG
   slices with today (components.benchmark.estimated_footprint_mib).
4. pooled GPU memory: what each further model costs a process that holds
   POOLED_MODELS of them (a pool member whose backend runs its models in
   the server's process), against a process of its own per model (table 3).

Imports only the standard library, torch, onnx, onnxruntime, numpy and
kubeloop modules built on those (a GPU machine has no pydantic, kopf or
mlflow); rich is used when it is there. Never asserts a time: speed is a
ratio to a baseline of the same run.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _bootstrap() -> None:
    """kubeloop.* from this source tree, installed or not: pyproject maps the
    package to src/kubeloop, whose area folders link to the top-level ones;
    where a copy of the tree lost the links, the areas are found at the root."""
    if "kubeloop" not in sys.modules:
        sys.path.insert(0, str(REPO / "src"))
    import kubeloop

    if not (REPO / "src" / "kubeloop" / "components").is_dir():
        kubeloop.__path__.append(str(REPO))


_bootstrap()

import argparse  # noqa: E402
import copy  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kubeloop.components.benchmark import (  # noqa: E402
    CONTEXT_MIB,
    estimated_footprint_mib,
    footprint_mib,
    measure_interleaved,
    measuring,
)
from kubeloop.components.model import Architecture, export_onnx, load_model, save_model  # noqa: E402
from kubeloop.components.training import TrainSettings, pick_precision, train  # noqa: E402
from kubeloop.components.variants import (  # noqa: E402
    BUILDERS,
    BuildContext,
    NotBuilt,
    Variant,
    ort_predict,
    ort_session,
    rows,
    source,
    torch_predict,
)
from kubeloop.gpu.catalog import gpu_model  # noqa: E402
from tests.bench.repeat import RUNS, Figure, figures, repeat  # noqa: E402

NO_GPU = "not measured (no GPU on this machine)"
MIB = 2**20
REFERENCE_GPU = "NVIDIA-H100-80GB-HBM3"
"""Whose MIG profiles the memory table names when this GPU is not in the catalogue."""


@dataclass(frozen=True)
class Case:
    name: str
    task: str
    n_features: int
    n_outputs: int
    architecture: Architecture | None = None
    """None: the trainer's default, the built-in MLP at TrainSettings' widths."""


CASES = (
    Case("built-in MLP", "binary", 20, 1),
    # As examples/maintenance/trainingjob.yaml names it (a test holds the two together).
    Case("team module (maintenance)", "multiclass", 13, 4,
         Architecture("multiclass", 13, 4, "maintenance_model:build", {"hidden": 64, "blocks": 2},
                      str(REPO / "examples" / "maintenance" / "model"))),
)


@dataclass(frozen=True)
class Sizes:
    rows: int
    epochs: int
    batch_size: int
    batches: tuple[int, ...]
    """Inference batch sizes; the largest also sizes the memory figures."""
    budget: dict = field(default_factory=dict)
    """measure_interleaved's budget per repeat."""


def sizes(quick: bool, gpu: bool) -> Sizes:
    """GPU sizes keep the device busy (batch 4096, as the training suite's GPU
    rows); CPU sizes keep a CI smoke run to seconds."""
    small = {"seconds": 0.02, "rounds": 3, "min_samples": 9, "max_samples": 60, "warmup": 5}
    if gpu:
        return (Sizes(65536, 2, 4096, (32,), small) if quick else
                Sizes(262144, 3, 4096, (1, 32, 1024), {"seconds": 0.3, "rounds": 10, "min_samples": 100,
                                                       "max_samples": 2000}))
    return Sizes(1024, 2, 512, (32,), small) if quick else Sizes(16384, 3, 512, (1, 32), small)


def synthetic(case: Case, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the case's shape with a learnable label; features on scales from
    0.5 to 50, as a feature store gives them (the model standardises)."""
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.5, 50, case.n_features)
    z = rng.normal(size=(n, case.n_features))
    scores = z @ rng.normal(size=(case.n_features, max(case.n_outputs, 2))) + rng.normal(size=(n, 1))
    y = scores.argmax(1) if case.task == "multiclass" else (scores[:, 0] > 0).astype(np.float32)
    return (z * scale).astype(np.float32), y


# -- 1. training ------------------------------------------------------------

def train_throughput(x: np.ndarray, y: np.ndarray, settings: TrainSettings, **kwargs) -> float:
    """Median samples/s of one training run (its first epoch warms up)."""
    return float(np.median([h["samples_per_second"]
                            for h in train(x, y, None, None, settings, **kwargs).history[1:]]))


def training(case: Case, x: np.ndarray, y: np.ndarray, settings: TrainSettings, device: torch.device) -> dict:
    """fp32 against autocast, alternating in each of RUNS runs; GPU peaks too."""
    cuda = device.type == "cuda"
    amp = pick_precision(device) if cuda else "bf16"  # the trainer keeps a CPU in fp32; measured to show why

    def once(_: int) -> dict:
        out = {}
        for label, precision in (("fp32", "fp32"), ("autocast", amp)):
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            out[label] = train_throughput(x, y, settings, gpus=int(cuda), precision=precision,
                                          architecture=case.architecture)
            if cuda:
                out[f"{label}_peak"] = torch.cuda.max_memory_allocated() / MIB
        return {**out, "ratio": out["autocast"] / out["fp32"]}

    units = {"fp32": "samples/s", "autocast": "samples/s", "ratio": "x"}
    if cuda:
        units.update({"fp32_peak": "MiB", "autocast_peak": "MiB"})
    runs = figures(repeat(once, RUNS), units)
    return {"backend": _backend(device), "precision": amp, **{f.name: f.to_json() for f in runs}}


# -- 2. inference -----------------------------------------------------------

def cuda_graphs(ctx: BuildContext) -> Variant:
    """The fp32 source replayed from a CUDA graph captured per batch size on
    its first call: one launch per call instead of one per kernel. Not an
    optimiser technique (yet): measured here to see whether it should be."""
    if ctx.device.type != "cuda":
        raise NotBuilt("CUDA graphs need a GPU")
    model = copy.deepcopy(ctx.source).to(ctx.device).eval()
    graphs: dict[int, tuple] = {}

    def capture(n: int) -> tuple:
        static_in = torch.zeros(n, ctx.n_features, device=ctx.device)
        side = torch.cuda.Stream()  # capture wants its warm-up off the default stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(3):
                model(static_in)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            static_out = model(static_in)
        return graph, static_in, static_out

    def predict(x: np.ndarray) -> np.ndarray:
        if len(x) not in graphs:
            graphs[len(x)] = capture(len(x))
        graph, static_in, static_out = graphs[len(x)]
        static_in.copy_(torch.from_numpy(x))
        graph.replay()
        return rows(static_out.float().cpu().numpy())

    artifact = ctx.workdir / "cuda-graphs.pt"
    torch.save(model.state_dict(), artifact)
    return Variant("cuda-graphs", "torch", predict, artifact, note="fp32, one graph per batch size", module=model)


def onnx_cuda(ctx: BuildContext) -> Variant:
    """onnxruntime with the CUDA execution provider, where the installed build
    has one and its libraries load (onnxruntime otherwise falls back to the
    CPU quietly, which would pass a CPU figure off as a GPU one)."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise NotBuilt(f"this onnxruntime build ({ort.__version__}) has no CUDAExecutionProvider")
    path = export_onnx(copy.deepcopy(ctx.source).cpu().float(), ctx.workdir / "onnx-cuda.onnx")
    session = ort_session(path, ctx.device)
    if session.get_providers()[0] != "CUDAExecutionProvider":
        raise NotBuilt("onnxruntime lists CUDAExecutionProvider, but its CUDA libraries did not load")
    return Variant("onnx-cuda", "onnxruntime", ort_predict(session), path, onnx=path, note="CUDA provider")


GPU_VARIANTS = {"fp16": BUILDERS["fp16"], "bf16": BUILDERS["bf16"], "torch-compile": BUILDERS["torch-compile"],
                "cuda-graphs": cuda_graphs, "onnx-cuda": onnx_cuda}
CPU_VARIANTS = {"onnx-cpu": BUILDERS["onnx"]}
"""Without a GPU: one variant, so the measuring path runs in CI."""


def inference(model, x: np.ndarray, device: torch.device, size: Sizes, workdir: Path) -> dict:  # noqa: ANN001
    """Each variant against the fp32 eager source: per batch size, p50 ms and
    speedup (source p50 / variant p50), the median of RUNS interleaved
    measurements with their spread."""
    gpu = device.type == "cuda"
    # The spec is not read by these builders (only by pruning, distillation and TensorRT).
    ctx = BuildContext(model.to(device), x, None, None, workdir, device)
    wanted = GPU_VARIANTS | ({} if gpu else CPU_VARIANTS)
    built, results = {"source": source(ctx)}, {}
    for name, build in wanted.items():
        if name in GPU_VARIANTS and not gpu:
            results[name] = {"status": NO_GPU}
            continue
        try:
            built[name] = _answering(build(ctx), pool_of(x, size))
        except NotBuilt as exc:
            results[name] = {"status": f"not built: {exc}"}
        except Exception as exc:  # noqa: BLE001 - one variant that breaks on this GPU must not cost the others' figures
            results[name] = {"status": f"failed: {type(exc).__name__}: {str(exc)[:160]}"}
    predicts = {name: v.predict for name, v in built.items()}
    pool = pool_of(x, size)

    def once(_: int) -> dict:
        out = {}
        for b in size.batches:
            latency = measure_interleaved(predicts, pool, b, device=device, **size.budget)
            for name in predicts:
                out[f"{name} b{b} p50"] = latency[name].p50.value
                out[f"{name} b{b} speedup"] = latency["source"].p50.value / latency[name].p50.value
        return out

    with measuring():
        runs = repeat(once, RUNS)
    for name, variant in built.items():
        units = {f"{name} b{b} {k}": u for b in size.batches for k, u in (("p50", "ms"), ("speedup", "x"))}
        figs = {f.name: f for f in figures(runs, units)}
        results[name] = {"status": "measured", "backend": _backend(device), "runtime": variant.runtime,
                         "note": variant.note, "batches": {str(b): _batch(figs, name, b) for b in size.batches}}
    return {name: results[name] for name in ["source", *wanted]}


def pool_of(x: np.ndarray, size: Sizes) -> np.ndarray:
    return x[: max(4096, 8 * max(size.batches))]


def _answering(variant: Variant, pool: np.ndarray) -> Variant:
    """The variant, once it has answered a batch: a capture or compile that
    fails on first use fails here, before the interleaved timing."""
    variant.predict(pool[:1])
    return variant


def _batch(figs: dict[str, Figure], name: str, b: int) -> dict:
    p50 = figs[f"{name} b{b} p50"]
    return {"p50_ms": p50.to_json(), "speedup": figs[f"{name} b{b} speedup"].to_json(),
            "rows_per_s": round(b / (p50.median / 1000))}


# -- 3. GPU memory ----------------------------------------------------------

def memory(model, n_features: int, device: torch.device, size: Sizes, workdir: Path) -> dict:  # noqa: ANN001
    """Placement's estimate against a fresh process serving the model."""
    batch = max(size.batches)
    out = {"batch": batch, "estimate_mib": estimated_footprint_mib(model, n_features, batch),
           "assumed_context_mib": CONTEXT_MIB, "no_footprint_mib": _assumed_footprint()}
    if device.type != "cuda":
        return {**out, "measured": NO_GPU}
    save_model(model.cpu(), workdir / "served")
    probe = subprocess.run([sys.executable, "-m", "tests.bench.gpu_suite", "--probe-memory", str(workdir / "served"),
                            "--batches", ",".join(map(str, size.batches))],
                           cwd=REPO, capture_output=True, text=True)
    if probe.returncode != 0:  # the other tables stand; this one says why it has no figure
        return {**out, "measured": f"not measured: the probe failed: {probe.stderr.strip()[-300:]}"}
    measured = json.loads(probe.stdout.splitlines()[-1])
    gpu = gpu_model(torch.cuda.get_device_name().replace(" ", "-")) or gpu_model(REFERENCE_GPU)
    whole = measured["process_mib"] or measured["optimiser_measured_mib"]
    out.update(measured=measured, profiles_of=gpu.product,
               ratio_estimate_to_measured=round(out["estimate_mib"] / whole, 3),
               ratio_optimiser_to_measured=round(measured["optimiser_measured_mib"] / whole, 3),
               mig_profile={k: _profile(gpu, v) for k, v in
                            (("estimate", out["estimate_mib"]), ("optimiser", measured["optimiser_measured_mib"]),
                             ("measured", whole))})
    return out


def _profile(gpu, need: float) -> str:  # noqa: ANN001 - catalog.GpuModel
    profile = gpu.smallest_profile(math.ceil(need))
    return profile.name if profile else "none fits"


def _assumed_footprint() -> int | str:
    """What placement assumes with no footprint at all; its module needs the API's pydantic types."""
    try:
        from kubeloop.gpu.placement import ASSUMED_FOOTPRINT_MIB
    except ImportError as exc:
        return f"not read: kubeloop.gpu.placement needs {exc.name}"
    return ASSUMED_FOOTPRINT_MIB


def probe_memory(folder: Path, batches: list[int]) -> dict:
    """In a fresh process (no training's cache, no other model): load the
    model as serving does, answer each batch size, and read the allocator and
    the device. NVML's device total is read before CUDA starts, so the
    difference is this process's whole share: its context and loaded kernels
    as well as what the allocator holds."""
    before = _device_used_mib()
    device = torch.device("cuda")
    model = load_model(folder).to(device)
    predict = torch_predict(model, device)
    x = np.random.default_rng(0).normal(size=(max(batches), model.architecture.n_inputs)).astype(np.float32)
    for b in batches:
        predict(x[:b])
    torch.cuda.synchronize()
    after = _device_used_mib()
    reserved = torch.cuda.memory_reserved() / MIB
    process = after - before if before is not None and after is not None else None
    out = {"peak_allocated_mib": round(torch.cuda.max_memory_allocated() / MIB, 2),
           "peak_reserved_mib": round(torch.cuda.max_memory_reserved() / MIB, 2),
           "process_mib": process and round(process, 1),
           "context_mib": process and round(process - reserved, 1)}
    # Last: it resets the allocator's peak. The optimiser's GPU figure, peak + CONTEXT_MIB.
    out["optimiser_measured_mib"] = footprint_mib(predict, model, x, max(batches), device)[0]
    return out


def _device_used_mib() -> float | None:
    """Device memory in use by every process (NVML, as nvidia-smi), without
    starting CUDA in this one; None where NVML is not there."""
    try:
        return torch.cuda.device_memory_used(0) / MIB
    except Exception:  # noqa: BLE001 - pynvml missing or the driver refusing: not measurable here
        return None


# -- 4. pooled GPU memory ---------------------------------------------------

POOLED_MODELS = 64
"""Models the pool probe's one process loads, as a pool member holds many."""
POOL_MEMBERS, POOL_SERVICES = 4, 1000
"""Issue 32's pool: 1,000 models on four members."""


def pooled(device: torch.device, size: Sizes, workdir: Path, memory_row: dict) -> dict:
    """A fresh process holding POOLED_MODELS copies of the model (table 3's
    saved one) against table 3's process of its own, and what 1,000 models
    would take either way, held at once, computed from those two readings."""
    out = {"models": POOLED_MODELS, "batch": max(size.batches)}
    own = memory_row["measured"]["process_mib"] if isinstance(memory_row["measured"], dict) else None
    if device.type != "cuda":
        return {**out, "measured": NO_GPU}
    probe = subprocess.run([sys.executable, "-m", "tests.bench.gpu_suite", "--probe-pool", str(workdir / "served"),
                            "--batches", str(out["batch"]), "--models", str(POOLED_MODELS)],
                           cwd=REPO, capture_output=True, text=True)
    if probe.returncode != 0:
        return {**out, "measured": f"not measured: the probe failed: {probe.stderr.strip()[-300:]}"}
    measured = json.loads(probe.stdout.splitlines()[-1])
    out["measured"] = measured
    if own and measured["process_mib"] is not None:
        shared = POOL_MEMBERS * (measured["context_mib"] + measured["first_model_mib"])
        pool = shared + (POOL_SERVICES - POOL_MEMBERS) * measured["further_model_mib"]
        out.update(own_process_mib=own, thousand={"own_processes_mib": round(POOL_SERVICES * own),
                                                  "pool_mib": round(pool), "ratio": round(POOL_SERVICES * own / pool, 1)})
    return out


def probe_pool(folder: Path, batch: int, models: int) -> dict:
    """In a fresh process: CUDA started, then `models` copies of the model
    loaded one after another, each answering a batch, the device read after
    each (NVML, as nvidia-smi). The first load also brings the kernels and
    cuBLAS's workspace that the later ones share; a further model costs its
    weights and what the allocator rounds them up to."""
    device = torch.device("cuda")
    before = _device_used_mib()
    torch.zeros(1, device=device)
    torch.cuda.synchronize()
    started = _device_used_mib()
    held, used, allocated = [], [], []
    for _ in range(models):
        model = load_model(folder).to(device)
        predict = torch_predict(model, device)
        x = np.random.default_rng(0).normal(size=(batch, model.architecture.n_inputs)).astype(np.float32)
        predict(x)
        torch.cuda.synchronize()
        held.append((model, predict))
        used.append(_device_used_mib())
        allocated.append(torch.cuda.memory_allocated() / MIB)
    further = models - 1
    out = {"allocated_per_model_mib": round((allocated[-1] - allocated[0]) / further, 3), "process_mib": None}
    if before is None or started is None or None in used:
        return out
    return {**out, "context_mib": round(started - before, 1), "first_model_mib": round(used[0] - started, 1),
            "further_model_mib": round((used[-1] - used[0]) / further, 3), "process_mib": round(used[-1] - before, 1)}


# -- the run ----------------------------------------------------------------

def _backend(device: torch.device) -> str:
    return torch.cuda.get_device_name() if device.type == "cuda" else "CPU"


def measure_case(case: Case, device: torch.device, size: Sizes, workdir: Path, say) -> dict:  # noqa: ANN001
    x, y = synthetic(case, size.rows)
    settings = TrainSettings(epochs=size.epochs, batch_size=size.batch_size, learning_rate=0.003, seed=1)
    say(f"gpu suite: {case.name}: training, fp32 vs autocast, {RUNS} alternating runs")
    trained = training(case, x, y, settings, device)
    model = train(x, y, None, None, settings, gpus=int(device.type == "cuda"), precision="fp32",
                  architecture=case.architecture).model
    # train() turns deterministic algorithms on for the process; serving never runs with them.
    torch.use_deterministic_algorithms(False)
    say(f"gpu suite: {case.name}: variants against fp32 eager, {RUNS} interleaved measurements")
    served = inference(model, x, device, size, workdir)
    say(f"gpu suite: {case.name}: memory")
    served_memory = memory(model, case.n_features, device, size, workdir)
    say(f"gpu suite: {case.name}: {POOLED_MODELS} models in one process")
    return {"training": trained, "inference": served, "memory": served_memory,
            "pooled": pooled(device, size, workdir, served_memory)}


def run(context, console, quick: bool = False) -> dict:  # noqa: ANN001 - tests.bench's Context, rich Console or None
    """The suite (tests.bench's signature); console None prints plain text."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    size = sizes(quick, device.type == "cuda")
    say = console.log if console is not None else (lambda message: print(message, file=sys.stderr))
    results = {"device": _backend(device), "quick": quick, "torch": torch.__version__,
               "sizes": {"rows": size.rows, "epochs": size.epochs, "train_batch": size.batch_size,
                         "batches": list(size.batches)}, "cases": {}}
    with tempfile.TemporaryDirectory(prefix="kubeloop-gpu-bench-") as tmp:
        for i, case in enumerate(CASES):
            (Path(tmp) / str(i)).mkdir()
            results["cases"][case.name] = measure_case(case, device, size, Path(tmp) / str(i), say)
    show(results, console)
    return results


# -- tables -----------------------------------------------------------------

def tables(results: dict) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, columns, rows) of the four tables, from the results alone."""
    device = results["device"]
    train_rows, infer_rows, memory_rows, pool_rows = [], [], [], []
    for name, case in results["cases"].items():
        t = case["training"]
        train_rows.append([name, t["backend"], _fig(t["fp32"]), f"{t['precision']}: {_fig(t['autocast'])}",
                           _fig(t["ratio"]),
                           " / ".join(_fig(t[k]) for k in ("fp32_peak", "autocast_peak") if k in t) or "-"])
        for technique, row in case["inference"].items():
            if row["status"] != "measured":
                infer_rows.append([name, technique, row["status"], "", "", ""])
                continue
            for b, fig in row["batches"].items():
                infer_rows.append([name, f"{technique} ({row['runtime']})", f"b{b}", _fig(fig["p50_ms"]),
                                   _fig(fig["speedup"]), f"{fig['rows_per_s']:,}"])
        memory_rows.append(_memory_row(name, case["memory"]))
        pool_rows.append(_pooled_row(name, case["pooled"]))
        assumed = case["memory"]["no_footprint_mib"]
    return [
        (f"GPU suite: training samples/s, fp32 vs autocast ({device})",
         ["model", "backend", "fp32", "autocast", "autocast / fp32", "peak MiB fp32 / autocast"], train_rows),
        (f"GPU suite: inference, each variant against fp32 eager in the same run ({device})",
         ["model", "variant", "batch", "p50 ms", "speedup vs fp32", "rows/s"], infer_rows),
        (f"GPU suite: served model's GPU memory, measured vs the estimate placement uses (with no footprint "
         f"at all placement assumes {assumed} MiB)",
         ["model", "batch", "estimate (placement)", "optimiser's GPU figure", "measured process",
          "allocated / reserved peak", "context", "estimate / measured", "MIG profile est. / measured"],
         memory_rows),
        (f"GPU suite: pooled GPU memory, {POOLED_MODELS} models in one process against a process of its own "
         f"per model; {POOL_SERVICES:,} models held at once on {POOL_MEMBERS} members computed from them",
         ["model", "batch", "context", "first model", "each further model (device / allocated)",
          "own process per model", f"{POOL_SERVICES:,} models: own processes / pool"], pool_rows),
    ]


def _memory_row(name: str, m: dict) -> list[str]:
    estimate = f"{m['estimate_mib']} MiB (incl. {m['assumed_context_mib']} context)"
    if not isinstance(m["measured"], dict):
        return [name, str(m["batch"]), estimate, m["measured"], m["measured"], "", "", "", ""]
    got = m["measured"]
    return [name, str(m["batch"]), estimate, f"{got['optimiser_measured_mib']} MiB",
            f"{got['process_mib']} MiB" if got["process_mib"] is not None else "not measurable (no NVML)",
            f"{got['peak_allocated_mib']} / {got['peak_reserved_mib']} MiB",
            f"{got['context_mib']} MiB" if got["context_mib"] is not None else "-",
            f"{m['ratio_estimate_to_measured']}x",
            f"{m['mig_profile']['estimate']} / {m['mig_profile']['measured']} ({m['profiles_of']})"]


def _pooled_row(name: str, p: dict) -> list[str]:
    got = p["measured"]
    if not isinstance(got, dict):
        return [name, str(p["batch"]), got, "", "", "", ""]
    if got["process_mib"] is None:
        return [name, str(p["batch"]), "not measurable (no NVML)", "", f"- / {got['allocated_per_model_mib']} MiB",
                "", ""]
    thousand = p.get("thousand")
    return [name, str(p["batch"]), f"{got['context_mib']} MiB", f"{got['first_model_mib']} MiB",
            f"{got['further_model_mib']} / {got['allocated_per_model_mib']} MiB",
            f"{p['own_process_mib']} MiB" if thousand else "-",
            f"{thousand['own_processes_mib']:,} / {thousand['pool_mib']:,} MiB ({thousand['ratio']}x)" if thousand else "-"]


def _fig(f: dict) -> str:
    flag = " (spread > 10%)" if f["flagged"] else ""
    return f"{f['median']:,.4g} {f['unit']} ±{f['spread']:.0%}{flag}".replace(" x ", "x ")


def show(results: dict, console) -> None:  # noqa: ANN001
    for title, columns, body in tables(results):
        if console is not None:
            from rich.table import Table

            table = Table(title=title)
            for column in columns:
                table.add_column(column)
            for row in body:
                table.add_row(*row)
            console.print(table)
        else:
            print(plain_table(title, columns, body))


def plain_table(title: str, columns: list[str], body: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [columns, *body]) for i in range(len(columns))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([title, line(columns), line(["-" * w for w in widths]), *map(line, body), ""])


def _console():  # noqa: ANN202 - a rich Console, or None for plain text
    try:
        from rich.console import Console
    except ImportError:
        return None
    return Console(width=200)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.gpu_suite", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    parser.add_argument("--json", type=Path, default=REPO / "bench-results" / "gpu.json", help="results file")
    parser.add_argument("--probe-memory", type=Path, help=argparse.SUPPRESS)  # the memory table's child process
    parser.add_argument("--probe-pool", type=Path, help=argparse.SUPPRESS)  # the pooled table's child process
    parser.add_argument("--batches", default="1", help=argparse.SUPPRESS)
    parser.add_argument("--models", type=int, default=POOLED_MODELS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe_pool:
        print(json.dumps(probe_pool(args.probe_pool, int(args.batches), args.models)))
        return
    if args.probe_memory:
        print(json.dumps(probe_memory(args.probe_memory, [int(b) for b in args.batches.split(",")])))
        return
    results = run(None, _console(), quick=args.quick)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
