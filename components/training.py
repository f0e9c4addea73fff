"""The torch trainer: precision chosen for the device, gradient accumulation,
optional activation checkpointing, a tuned DataLoader, deterministic seeding,
checkpoint and resume, and DistributedDataParallel through torchrun."""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, Dataset

from kubeloop.api.tasks import PRIMARY
from kubeloop.components.model import BUILTIN, Architecture, TaskModel, build_model
from kubeloop.components.profiling import LoopMeter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSettings:
    """Everything that decides the trained weights (and so the checkpoint's identity)."""

    epochs: int = 5
    batch_size: int = 256
    learning_rate: float = 1e-3
    weight_decay: float = 1e-4
    hidden_units: tuple[int, ...] = (64, 32)
    dropout: float = 0.1
    gradient_accumulation_steps: int = 1
    activation_checkpointing: bool = False
    seed: int = 42

    @classmethod
    def from_spec(cls, hp, seed: int) -> "TrainSettings":  # noqa: ANN001 - api Hyperparameters
        return cls(hp.epochs, hp.batch_size, hp.learning_rate, hp.weight_decay, tuple(hp.hidden_units),
                   hp.dropout, hp.gradient_accumulation_steps, hp.activation_checkpointing, seed)

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def builtin(self, task: str, n_inputs: int, n_outputs: int) -> Architecture:
        """The built-in perceptron with these settings' widths and dropout."""
        return Architecture(task, n_inputs, n_outputs, BUILTIN,
                            {"hidden_units": list(self.hidden_units), "dropout": self.dropout})


@dataclass(frozen=True)
class LoaderSettings:
    """How batches reach the model; logged with the run."""

    tuned: bool = True
    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None


@dataclass
class TrainResult:
    model: TaskModel
    precision: str
    device: str
    loader: LoaderSettings
    history: list[dict] = field(default_factory=list)
    resumed_from_epoch: int = 0
    samples_per_second: float = 0.0
    bottleneck: dict | None = None  # kubeloop.components.bottleneck.build_report's; None when no step ran
    trace: Path | None = None  # the profiler's Chrome trace (gzipped), when one was recorded


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def pick_device(requested_gpus: int = 0) -> torch.device:
    return torch.device("cuda") if requested_gpus > 0 and torch.cuda.is_available() else torch.device("cpu")


def pick_precision(device: torch.device) -> str:
    """bf16 autocast where the GPU has bf16 units (Ampere and newer), fp16
    with a GradScaler on older GPUs, fp32 on the CPU (autocast buys nothing
    for a small MLP there and costs accuracy)."""
    if device.type != "cuda":
        return "fp32"
    return "bf16" if torch.cuda.is_bf16_supported() else "fp16"


def tuned_loader_settings(device: torch.device, cpus: int | None = None) -> LoaderSettings:
    """Workers only when there are cores to spare, pinned memory only for a
    GPU, persistent workers and deeper prefetch when there are workers."""
    cpus = cpus or os.cpu_count() or 1
    workers = min(4, max(0, cpus - 2)) if device.type == "cuda" else 0
    return LoaderSettings(tuned=True, num_workers=workers, pin_memory=device.type == "cuda",
                          persistent_workers=workers > 0, prefetch_factor=4 if workers else None)


NAIVE_LOADER = LoaderSettings(tuned=False)


class RowDataset(Dataset):
    """One row per item: the textbook Dataset whose default collate stacks
    batch_size small tensors per batch (the naive baseline)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):  # noqa: ANN204
        return self.x[i], self.y[i]


class BatchDataset(RowDataset):
    """Whole batches per item: one tensor gather per batch instead of
    batch_size __getitem__ calls and a stack."""

    def __getitem__(self, indices: list[int]):  # noqa: ANN204
        index = torch.as_tensor(indices)
        return self.x[index], self.y[index]


class ShardSampler(torch.utils.data.Sampler):
    """A seeded permutation per epoch, sharded across DDP ranks (each rank
    sees a disjoint, equally long slice, like DistributedSampler)."""

    def __init__(self, n: int, seed: int, rank: int = 0, world: int = 1):
        self.n, self.seed, self.rank, self.world, self.epoch = n, seed, rank, world, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // self.world

    def __iter__(self):  # noqa: ANN204
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.n, generator=g)
        per_rank = self.n // self.world
        return iter(order[self.rank * per_rank:(self.rank + 1) * per_rank].tolist())


def make_loader(x: torch.Tensor, y: torch.Tensor, batch_size: int, settings: LoaderSettings, seed: int,
                rank: int = 0, world: int = 1) -> tuple[DataLoader, ShardSampler]:
    sampler = ShardSampler(len(y), seed, rank, world)
    if settings.tuned:
        batches = BatchSampler(sampler, batch_size, drop_last=False)
        loader = DataLoader(BatchDataset(x, y), sampler=batches, batch_size=None,
                            num_workers=settings.num_workers, pin_memory=settings.pin_memory,
                            persistent_workers=settings.persistent_workers,
                            prefetch_factor=settings.prefetch_factor)
    else:
        loader = DataLoader(RowDataset(x, y), sampler=sampler, batch_size=batch_size)
    return loader, sampler


SHARED_CHECKPOINT = "rank0.pt"
"""The checkpoint every rank resumes from when train publishes one."""


def _atomic_save(obj: dict, path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


@dataclass(frozen=True)
class Distillation:
    """Learn from a teacher's softened outputs as well as the labels."""

    teacher: TaskModel
    temperature: float
    alpha: float


def task_loss(task: str, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy on one logit, cross-entropy over the classes, or
    mean squared error on the standardised label."""
    if task == "multiclass":
        return nn.functional.cross_entropy(logits, y)
    if task == "binary":
        return nn.functional.binary_cross_entropy_with_logits(logits[:, 0], y)
    return nn.functional.mse_loss(logits[:, 0], y)


def soft_loss(task: str, logits: torch.Tensor, teacher: torch.Tensor, t: float) -> torch.Tensor:
    """The student's loss against the teacher's raw scores at temperature t.
    Hinton et al.: scaled by t^2 so its gradients keep their size as t grows."""
    if task == "binary":
        soft = torch.sigmoid(teacher / t)
        return nn.functional.binary_cross_entropy_with_logits(logits / t, soft) * t * t
    if task == "multiclass":
        return nn.functional.kl_div(torch.log_softmax(logits / t, -1), torch.softmax(teacher / t, -1),
                                    reduction="batchmean") * t * t
    return nn.functional.mse_loss(logits, teacher)


def targets(task: str, y: np.ndarray, model: TaskModel | None = None) -> torch.Tensor:
    """The label as the loss wants it: class indices, 0/1 floats, or the
    value standardised with the model's target statistics."""
    if task == "multiclass":
        return torch.as_tensor(y, dtype=torch.int64)
    t = torch.as_tensor(y, dtype=torch.float32)
    if task == "regression" and model is not None:
        t = (t - model.target_mean) / model.target_scale
    return t


@dataclass
class _Step:
    """One micro-batch: forward, loss (with a teacher's soft targets when
    distilling), backward, and the optimiser step on the accumulation's last."""

    net: nn.Module
    task: str
    autocast: object
    scaler: torch.amp.GradScaler
    optimizer: torch.optim.Optimizer
    accumulate: int
    world: int
    teacher: TaskModel | None
    distillation: Distillation | None

    def __call__(self, xb: torch.Tensor, yb: torch.Tensor, last_micro_batch: bool) -> float:
        """The micro-batch's loss, unscaled by the accumulation."""
        net = self.net
        # Gradients are all-reduced only on the micro-batch that steps.
        sync = nullcontext() if self.world == 1 or last_micro_batch else net.no_sync()
        with sync:
            with self.autocast:
                logits = (net.module.logits(xb) if self.world > 1 else net.logits(xb)).float()
                loss = task_loss(self.task, logits, yb)
                if self.teacher is not None:
                    with torch.no_grad():
                        taught = self.teacher.logits(xb).float()
                    distill = soft_loss(self.task, logits, taught, self.distillation.temperature)
                    loss = self.distillation.alpha * distill + (1 - self.distillation.alpha) * loss
                loss = loss / self.accumulate
            self.scaler.scale(loss).backward()
        if last_micro_batch:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        return loss.item() * self.accumulate


def train(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray | None, y_val: np.ndarray | None,
          settings: TrainSettings, *, gpus: int = 0, checkpoint_dir: Path | None = None,
          profile_dir: Path | None = None,
          loader: LoaderSettings | None = None, progress: Callable[[dict], None] | None = None,
          rank: int = 0, world: int = 1, precision: str | None = None, model: TaskModel | None = None,
          distillation: Distillation | None = None, architecture: Architecture | None = None,
          publish_checkpoint: Callable[[Path], None] | None = None) -> TrainResult:
    """Train a network; resumes from checkpoint_dir when it holds a checkpoint
    of the same settings, architecture and data size. architecture is the
    network to build (default: the built-in perceptron of a binary task);
    precision forces fp32, fp16 or bf16 instead of the device's best; model
    fine-tunes an existing network instead of a fresh one; distillation adds
    a teacher's soft targets. The result carries the loop's bottleneck
    report, and a profiler trace of a few steps written to profile_dir.
    publish_checkpoint: one checkpoint for every rank (DDP keeps their
    weights, optimiser and random state equal), written by rank 0 and handed
    to it after each epoch; every rank resumes from it, so Pods restarted on
    other machines agree on the epoch."""
    seed_everything(settings.seed)
    device = pick_device(gpus)
    precision = precision or pick_precision(device)
    loader_settings = loader or tuned_loader_settings(device)
    x = torch.as_tensor(x_train, dtype=torch.float32)
    if model is None:
        architecture = architecture or settings.builtin("binary", x.shape[1], 1)
        model = build_model(architecture, settings.activation_checkpointing)
        model.set_normalisation(x.mean(0), x.std(0))
        if architecture.task == "regression":
            y64 = np.asarray(y_train, dtype=np.float64)
            model.set_target_normalisation(float(y64.mean()), float(y64.std()))
    task = model.task
    y = targets(task, y_train, model)
    model.to(device)
    teacher = distillation.teacher.to(device).eval() if distillation else None
    net: nn.Module = model
    if world > 1:
        net = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(net.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    data, sampler = make_loader(x, y, settings.batch_size, loader_settings, settings.seed, rank, world)

    identity = f"{settings.key()}|{json.dumps(asdict(model.architecture), sort_keys=True)}|{len(y)}|{world}"
    start_epoch, history = 0, []
    ckpt = checkpoint_dir / (SHARED_CHECKPOINT if publish_checkpoint else f"rank{rank}.pt") if checkpoint_dir else None
    if ckpt and ckpt.exists():
        saved = torch.load(ckpt, map_location=device, weights_only=True)
        if saved.get("identity") == identity:
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            scaler.load_state_dict(saved["scaler"])
            torch.set_rng_state(saved["rng"])
            start_epoch, history = saved["epoch"], saved["history"]
            log.info("resumed from the checkpoint of epoch %d", start_epoch)
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)
                if precision != "fp32" else nullcontext())
    step_once = _Step(net, task, autocast, scaler, optimizer, settings.gradient_accumulation_steps, world,
                      teacher, distillation)
    meter = LoopMeter(device, profile_dir, len(data) * (settings.epochs - start_epoch))
    samples, seconds = 0, 0.0
    for epoch in range(start_epoch, settings.epochs):
        net.train()
        sampler.set_epoch(epoch)
        started, total_loss, steps = time.perf_counter(), 0.0, 0
        optimizer.zero_grad(set_to_none=True)
        with meter.epoch(data) as batches:
            for step, (xb, yb) in enumerate(batches, start=1):
                with meter.timed("copy"):
                    xb = xb.to(device, non_blocking=True)
                    yb = yb.to(device, non_blocking=True)
                with meter.timed("step"):
                    total_loss += step_once(xb, yb, step % step_once.accumulate == 0 or step == len(data))
                meter.count(len(yb))
                steps += 1
                samples += len(yb)
        elapsed = time.perf_counter() - started
        seconds += elapsed
        record = {"epoch": epoch + 1, "loss": total_loss / max(steps, 1),
                  "samples_per_second": len(sampler) / elapsed if elapsed else 0.0}
        if x_val is not None and rank == 0:
            record[f"val_{PRIMARY[task]}"] = validation_score(model, x_val, y_val)
        history.append(record)
        if ckpt and (rank == 0 or not publish_checkpoint):
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            _atomic_save({"identity": identity, "epoch": epoch + 1, "history": history,
                          "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                          "scaler": scaler.state_dict(), "rng": torch.get_rng_state()}, ckpt)
            if publish_checkpoint:
                publish_checkpoint(ckpt)
        if progress and rank == 0:
            progress(record)
    model.cpu().eval()
    ranks = {"rank": rank, "world": world} if world > 1 else {}
    return TrainResult(model, precision, str(device), loader_settings, history, start_epoch,
                       samples / seconds if seconds else 0.0,
                       meter.report(loader_settings.num_workers, loader_settings.pin_memory, **ranks), meter.trace)


@torch.no_grad()
def predict(model: nn.Module, x: np.ndarray, batch: int = 8192) -> np.ndarray:
    """The model's outputs: one score or value per row ([n]) for binary and
    regression, a probability per class ([n, C]) for multiclass."""
    model.eval()
    tensor = torch.as_tensor(x, dtype=torch.float32)
    out = torch.cat([model(tensor[i:i + batch]) for i in range(0, len(tensor), batch)]).numpy()
    return out if out.ndim == 2 and out.shape[1] > 1 else out.reshape(-1)


def validation_score(model: TaskModel, x: np.ndarray, y: np.ndarray) -> float:
    """The task's primary metric on validation rows."""
    from kubeloop.components.evaluation import evaluate

    return evaluate(model.task, np.asarray(y), predict(model, x))[PRIMARY[model.task]]


# -- distributed ------------------------------------------------------------

def train_distributed(x_train: np.ndarray, y_train: np.ndarray, settings: TrainSettings, processes: int,
                      workdir: Path, gpus: int = 0, architecture: Architecture | None = None) -> TrainResult:
    """Train with DistributedDataParallel in `processes` torchrun workers
    (gloo on CPU, nccl on GPU); rank 0's weights are the result."""
    workdir.mkdir(parents=True, exist_ok=True)
    np.save(workdir / "x.npy", x_train)
    np.save(workdir / "y.npy", y_train)
    architecture = architecture or settings.builtin("binary", x_train.shape[1], 1)
    (workdir / "settings.json").write_text(json.dumps({**asdict(settings), "gpus": gpus,
                                                       "architecture": asdict(architecture)}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
           "-m", "kubeloop.components.training", str(workdir)]
    result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if result.returncode != 0:
        raise RuntimeError(f"torchrun with {processes} processes failed:\n{result.stderr[-4000:]}")
    out = torch.load(workdir / "result.pt", weights_only=True)
    model = build_model(architecture)
    model.load_state_dict(out["model"])
    model.eval()
    return TrainResult(model, out["precision"], out["device"], LoaderSettings(**out["loader"]), out["history"],
                       samples_per_second=out["samples_per_second"], bottleneck=out["bottleneck"],
                       trace=Path(out["trace"]) if out["trace"] else None)


def train_rank(x: np.ndarray, y: np.ndarray, settings: TrainSettings, gpus: int,
               checkpoint_dir: Path | None, architecture: Architecture | None = None,
               profile_dir: Path | None = None,
               publish_checkpoint: Callable[[Path], None] | None = None) -> TrainResult | None:
    """One rank of a DDP run started by torchrun (RANK, WORLD_SIZE and
    LOCAL_RANK in the environment); rank 0 returns the result. Its
    bottleneck report and trace are rank 0's own (every rank runs the same
    loop on an equal shard; the all-reduce waits show in rank 0's step time)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    use_cuda = gpus > 0 and torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    try:
        result = train(x, y, None, None, settings, gpus=gpus, checkpoint_dir=checkpoint_dir, rank=rank, world=world,
                       architecture=architecture, profile_dir=profile_dir if rank == 0 else None,
                       publish_checkpoint=publish_checkpoint)
        result.samples_per_second *= world
        return result if rank == 0 else None
    finally:
        dist.destroy_process_group()


def _worker(workdir: Path) -> None:
    """torchrun entry point of train_distributed."""
    raw = json.loads((workdir / "settings.json").read_text())
    gpus = raw.pop("gpus")
    architecture = Architecture(**raw.pop("architecture"))
    settings = TrainSettings(**{**raw, "hidden_units": tuple(raw["hidden_units"])})
    result = train_rank(np.load(workdir / "x.npy"), np.load(workdir / "y.npy"), settings, gpus,
                        workdir / "checkpoints", architecture, workdir / "profile")
    if result is not None:
        _atomic_save({"model": result.model.state_dict(), "precision": result.precision,
                      "device": result.device, "loader": asdict(result.loader), "history": result.history,
                      "samples_per_second": result.samples_per_second, "bottleneck": result.bottleneck,
                      "trace": str(result.trace) if result.trace else None}, workdir / "result.pt")


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
