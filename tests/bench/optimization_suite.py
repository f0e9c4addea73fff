"""Optimisation suite: every technique's variant of a trained fraud model,
measured in one run against the fp32 eager source (the baseline): p50/p99
latency per batch size, speedup at batch 32, size and accuracy delta. CPU
rows always; GPU rows (fp16, bf16, torch.compile, 2:4) when a GPU is here."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.components.optimize import measure_variants
from kubeloop.components.selection import choose
from kubeloop.components.training import TrainSettings, train
from kubeloop.components.variants import BuildContext
from tests.bench.training_suite import _data

CPU = ["dynamic-int8", "static-int8", "onnx", "onnx-int8", "structured-pruning", "unstructured-pruning",
       "distillation", "torch-compile"]
GPU = ["fp16", "bf16", "torch-compile", "onnx", "sparsity-2to4", "tensorrt-fp16"]
BATCHES = [1, 8, 32]


def _table(title: str, rows, choice) -> Table:
    table = Table(title=title)
    for column in ("technique", "runtime", *[f"p50/p99 ms b{b}" for b in BATCHES], "speedup b32 p99",
                   "size MB", "AUC delta", "accepted"):
        table.add_column(column)
    judged = {r.technique: r for r in choice.rows}
    for row in rows:
        r = judged[row.technique]
        if r.error:
            table.add_row(r.technique, "-", *["-"] * len(BATCHES), "-", "-", "-", f"not built: {r.error}")
            continue
        table.add_row(r.technique, r.runtime, *[f"{r.latency[b][0]:.3f} / {r.latency[b][1]:.3f}" for b in BATCHES],
                      f"{r.speedup:.2f}x", f"{r.size_mb:.3f}", f"{r.accuracy_delta:+.4f}",
                      "winner" if r is choice.winner else ("yes" if r.accepted else "no"))
    return table


def run(context, console: Console, quick: bool = False) -> dict:
    torch.set_num_threads(1)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        with console.status("optimisation: data and source model"):
            x, y, x_hold, y_hold = _data(Path(tmp), quick)
            model = train(x, y, None, None, TrainSettings(epochs=4, batch_size=512, learning_rate=0.003, seed=1)).model
        spec = OptimizedModelSpec.model_validate({"source": {"name": "bench", "version": "1"},
                                                  "batchSizes": BATCHES, "accuracyBudget": {"maxDrop": 0.01}})
        targets = [("cpu", torch.device("cpu"), CPU)]
        if torch.cuda.is_available():
            targets.append(("gpu", torch.device("cuda"), GPU))
        for name, device, techniques in targets:
            ctx = BuildContext(model.to(device), x, y, spec, Path(tmp) / name, device)
            ctx.workdir.mkdir()
            with console.status(f"optimisation: building and measuring {len(techniques)} variants on {name}"):
                rows, _ = measure_variants(ctx, techniques, BATCHES, "auc", x_hold, y_hold)
            choice = choose(rows, spec.accuracy_budget, spec.latency_slo)
            label = torch.cuda.get_device_name() if device.type == "cuda" else "CPU, 1 thread per runtime"
            console.print(_table(f"Optimised variants ({label}); baseline: fp32 eager source", rows, choice))
            results[name] = {r.technique: {"latency": {str(b): v for b, v in r.latency.items()},
                                           "speedup": r.speedup, "size_mb": r.size_mb,
                                           "accuracy_delta": r.accuracy_delta, "accepted": r.accepted,
                                           "error": r.error} for r in choice.rows}
            results[name]["winner"] = choice.winner.technique
            model = model.cpu()
    return results
