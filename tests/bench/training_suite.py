"""Training suite: throughput of the tuned DataLoader against the naive one
(same model, data and settings; five runs, naive and tuned alternating, each
figure's median and spread), DDP against one process (hold-out AUC), and on
a GPU: AMP against fp32 throughput and peak memory ("not measured" without one)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.data import build_dataset, load_split
from kubeloop.components.evaluation import evaluate
from kubeloop.components.training import NAIVE_LOADER, TrainSettings, predict, train, train_distributed
from kubeloop.featurestore.generate import Scenario, default_start
from kubeloop.featurestore.store import StoreLocation, create_repository
from tests.bench.gpu_suite import train_throughput as _throughput
from tests.bench.repeat import Figure, figures, figures_table, repeat

VIEWS = ["card_activity", "merchant_risk", "card_profile", "transaction_context"]


def _data(tmp: Path, quick: bool):
    repo = create_repository(tmp / "repo", Scenario(start=default_start(45), cards=1000 if quick else 2000))
    spec = TrainingJobSpec.model_validate({"modelName": "bench", "features": {"featureViews": VIEWS, "labels": {"source": "transactions", "column": "is_fraud"}}})
    info = build_dataset(spec, StoreLocation(path=str(repo)).to_json(), tmp / "data.parquet")
    train_frame, y = load_split(tmp / "data.parquet", info, "train")
    hold, y_hold = load_split(tmp / "data.parquet", info, "holdout")
    cols = info.feature_columns
    return train_frame[cols].to_numpy(np.float32), y, hold[cols].to_numpy(np.float32), y_hold


def auc(model, x: np.ndarray, y: np.ndarray) -> float:
    return evaluate("binary", y, predict(model, x))["auc"]


def _loaders(x, y, settings: TrainSettings) -> dict:
    """One run of each loader, back to back, and their ratio."""
    naive = _throughput(x, y, settings, loader=NAIVE_LOADER)
    tuned = _throughput(x, y, settings)
    return {"naive": naive, "tuned": tuned, "ratio": tuned / naive}


def run(context, console: Console, quick: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        with console.status("training: building the dataset"):
            x, y, x_hold, y_hold = _data(Path(tmp), quick)
        settings = TrainSettings(epochs=3, batch_size=512, learning_rate=0.003, seed=1)
        with console.status("training: naive vs tuned DataLoader, alternating runs"):
            loaders = figures(repeat(lambda _: _loaders(x, y, settings)),
                              {"naive": "samples/s", "tuned": "samples/s", "ratio": "x"})
        naive, tuned, ratio = (f.median for f in loaders)
        with console.status("training: DDP (2 gloo processes) vs 1 process"):
            single = train(x, y, None, None, settings)
            ddp = train_distributed(x, y, TrainSettings(**{**settings.__dict__, "batch_size": 256}), 2,
                                    Path(tmp) / "ddp")
        results = {
            "rows": int(len(y)), "batch_size": settings.batch_size,
            "naive_samples_per_s": round(naive), "tuned_samples_per_s": round(tuned),
            "tuned_over_naive": round(ratio, 2), "repeated": {f.name: f.to_json() for f in loaders},
            "auc_one_process": round(auc(single.model, x_hold, y_hold), 4),
            "auc_ddp_two_processes": round(auc(ddp.model, x_hold, y_hold), 4),
        }
        if torch.cuda.is_available():
            results.update(_gpu_rows(x, y, settings))
    table = Table(title=f"Training throughput ({results['rows']} rows, batch {settings.batch_size}, CPU)")
    for column in ("measure", "value"):
        table.add_column(column)
    table.add_row("naive DataLoader (per-row Dataset, default collate)", f"{results['naive_samples_per_s']:,} samples/s")
    table.add_row("tuned DataLoader (batched gather, tuned workers)", f"{results['tuned_samples_per_s']:,} samples/s")
    table.add_row("tuned / naive", f"{results['tuned_over_naive']}x")
    table.add_row("hold-out AUC, 1 process / DDP 2 processes",
                  f"{results['auc_one_process']} / {results['auc_ddp_two_processes']}")
    for key in ("gpu", "fp32_samples_per_s", "amp_samples_per_s", "amp_over_fp32", "fp32_peak_mib", "amp_peak_mib"):
        table.add_row(key, str(results.get(key, "not measured (no GPU on this machine)")))
    console.print(table)
    console.print(figures_table("training: the loaders' figures over alternating runs", loaders))
    if "gpu_runs" in results:
        console.print(figures_table("training: AMP vs fp32 on the GPU", results.pop("gpu_runs")))
    return results


def _gpu_rows(x, y, settings: TrainSettings) -> dict:
    """AMP against fp32 on the GPU: throughput (alternating runs) and peak memory."""
    big = TrainSettings(**{**settings.__dict__, "batch_size": 4096, "hidden_units": (1024, 1024, 512)})

    def once(_: int) -> dict:
        out = {}
        for label, precision in (("fp32", "fp32"), ("amp", None)):
            torch.cuda.reset_peak_memory_stats()
            out[label] = _throughput(x, y, big, gpus=1, precision=precision)
            out[f"{label}_peak"] = torch.cuda.max_memory_allocated() / 2**20
        return {**out, "ratio": out["amp"] / out["fp32"]}

    runs: list[Figure] = figures(repeat(once), {"fp32": "samples/s", "amp": "samples/s", "ratio": "x",
                                                "fp32_peak": "MiB", "amp_peak": "MiB"})
    fp32, amp, ratio, fp32_peak, amp_peak = (f.median for f in runs)
    return {"gpu": torch.cuda.get_device_name(), "fp32_samples_per_s": round(fp32), "amp_samples_per_s": round(amp),
            "amp_over_fp32": round(ratio, 2), "fp32_peak_mib": round(fp32_peak), "amp_peak_mib": round(amp_peak),
            "gpu_runs": runs}
