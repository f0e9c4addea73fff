"""Optimisation suite: every technique's variant of a trained model, measured
against the fp32 eager source (the baseline) in interleaved rounds (the
repeated design of components.benchmark): p50/p99 latency per batch size
with 95% intervals, speedup at batch 32 with its interval, size and the
budget metric's delta. Two use cases: the fraud model (binary, the built-in
MLP, AUC) and the maintenance team's fault classifier (multiclass, its own
residual module, accuracy). CPU rows always; GPU rows (fp16, bf16,
torch.compile, 2:4) when a GPU is here, "not measured" otherwise."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.components.evaluation import evaluate
from kubeloop.components.optimize import measure_variants
from kubeloop.components.selection import choose
from kubeloop.components.training import TrainSettings, train
from kubeloop.components.variants import BuildContext
from tests.bench.training_suite import _data

REPO = Path(__file__).resolve().parents[2]

CPU = ["dynamic-int8", "static-int8", "onnx", "onnx-int8", "structured-pruning", "unstructured-pruning",
       "distillation", "torch-compile"]
GPU = ["fp16", "bf16", "torch-compile", "onnx", "sparsity-2to4", "tensorrt-fp16"]
BATCHES = [1, 8, 32]


def _table(title: str, rows, choice, metric: str) -> Table:
    table = Table(title=title)
    for column in ("technique", "runtime", *[f"p50 / p99 ms b{b} [95%]" for b in BATCHES], "speedup b32 p99",
                   "size MB", f"{metric} delta", "accepted"):
        table.add_column(column)
    judged = {r.technique: r for r in choice.rows}
    for row in rows:
        r = judged[row.technique]
        if r.error:
            table.add_row(r.technique, "-", *["-"] * len(BATCHES), "-", "-", "-", f"not built: {r.error}")
            continue
        table.add_row(r.technique, r.runtime, *[f"{r.latency[b][0]}\n{r.latency[b][1]}" for b in BATCHES],
                      f"{r.speedup}x", f"{r.size_mb:.3f}", f"{r.accuracy_delta:+.4f}",
                      "winner" if r is choice.winner else ("yes" if r.accepted else "no"))
    return table


def _gpu_not_measured(title: str) -> Table:
    """No GPU here: the GPU rows say so, never a CPU figure in their place."""
    table = Table(title=title)
    for column in ("technique", "p50 / p99 ms", "speedup"):
        table.add_column(column)
    for technique in GPU:
        table.add_row(technique, "not measured (no GPU on this machine)", "not measured")
    return table


def fraud(tmp: Path, quick: bool) -> dict:
    x, y, x_hold, y_hold = _data(tmp, quick)
    model = train(x, y, None, None, TrainSettings(epochs=4, batch_size=512, learning_rate=0.003, seed=1)).model
    return {"name": "fraud (binary, built-in MLP)", "model": model, "data": (x, y, x_hold, y_hold), "metric": "auc",
            "score": lambda yy, out: evaluate("binary", yy, out)["auc"]}


def _maintenance(tmp: Path, quick: bool) -> dict:
    """The examples/maintenance team's data (its own store) and module."""
    import numpy as np
    import yaml

    from kubeloop.api.training import TrainingJobSpec
    from kubeloop.components.data import build_dataset, load_split
    from kubeloop.components.steps import architecture_for
    from kubeloop.featurestore.store import StoreLocation

    from examples.maintenance import prepare

    folder = REPO / "examples" / "maintenance"
    repo = prepare.prepare(tmp / "maintenance").repo
    wire = yaml.safe_load((folder / "trainingjob.yaml").read_text())["spec"]
    wire["model"]["path"] = str(folder / "model")
    spec = TrainingJobSpec.model_validate(wire)
    info = build_dataset(spec, StoreLocation(config=prepare.fill_config(repo)).to_json(), tmp / "m.parquet")
    frame, y = load_split(tmp / "m.parquet", info, "train")
    hold, y_hold = load_split(tmp / "m.parquet", info, "holdout")
    x, x_hold = frame[info.feature_columns].to_numpy(np.float32), hold[info.feature_columns].to_numpy(np.float32)
    settings = TrainSettings(epochs=2 if quick else 4, batch_size=256, learning_rate=0.003, seed=1)
    model = train(x, y, None, None, settings, architecture=architecture_for(spec, info)).model
    return {"name": "maintenance (multiclass, the team's residual module)", "model": model,
            "data": (x, y, x_hold, y_hold), "metric": "accuracy",
            "score": lambda yy, out: evaluate("multiclass", yy, out, classes=info.classes)["accuracy"]}


def run(context, console: Console, quick: bool = False) -> dict:
    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case in (fraud, _maintenance):
            with console.status(f"optimisation: data and source model ({case.__name__.strip('_')})"):
                use = case(Path(tmp), quick)
            results[use["name"]] = _measure(use, Path(tmp) / case.__name__.strip("_"), console)
    return results


def _measure(use: dict, tmp: Path, console: Console) -> dict:
    x, y, x_hold, y_hold = use["data"]
    model, metric = use["model"], use["metric"]
    spec = OptimizedModelSpec.model_validate({"source": {"name": "bench", "version": "1"}, "batchSizes": BATCHES,
                                              "accuracyBudget": {"metric": metric, "maxDrop": 0.01}})
    targets = [("cpu", torch.device("cpu"), CPU)]
    if torch.cuda.is_available():
        targets.append(("gpu", torch.device("cuda"), GPU))
    results = {}
    for name, device, techniques in targets:
        ctx = BuildContext(model.to(device), x, y, spec, tmp / name, device)
        ctx.workdir.mkdir(parents=True)
        with console.status(f"optimisation: building and measuring {len(techniques)} variants on {name}"):
            rows, _ = measure_variants(ctx, techniques, BATCHES, use["score"], x_hold, y_hold)
        choice = choose(rows, spec.accuracy_budget, spec.latency_slo, metric)
        label = (torch.cuda.get_device_name() if device.type == "cuda"
                 else "CPU, 1 thread per runtime, interleaved rounds, pinned where allowed")
        console.print(_table(f"{use['name']}: optimised variants ({label}); baseline: fp32 eager source", rows,
                             choice, metric))
        console.print(f"chosen: {choice.winner.technique} ({choice.basis}): {choice.why}")
        results[name] = {r.technique: {"latency": {str(b): [[e.value, e.low, e.high] for e in v]
                                                   for b, v in r.latency.items()},
                                       "speedup": r.speedup and [r.speedup.value, r.speedup.low, r.speedup.high],
                                       "size_mb": r.size_mb,
                                       "accuracy_delta": r.accuracy_delta, "accepted": r.accepted,
                                       "error": r.error} for r in choice.rows}
        results[name]["winner"] = choice.winner.technique
        model = model.cpu()
    if not torch.cuda.is_available():
        console.print(_gpu_not_measured(f"{use['name']}: GPU variants"))
        results["gpu"] = "not measured (no GPU on this machine)"
    return results
