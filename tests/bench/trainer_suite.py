"""The trainer pipeline backend against the local one, for the same
TrainingJob (the fraud example, two nodes, its store published in the
object store), on a platform of its own with the real node and the
operator on the host with both backends: apply to training started (the
local run's train step, the TrainJob's node Jobs active) and apply to
Succeeded, as ratios. The local backend's two torchrun processes share the
host's two cores with nothing in the way; the trainer backend's node Pods
get 500m each, as the TrainingJob asks, behind a dataset initializer Pod.
A first local run, not measured, starts the fork server the local steps
fork from (a cold one adds about 20 s to the first local run).

And what losing a node costs on the trainer backend: a node Pod deleted
once rank 0 has published a checkpoint, the run's total time against the
round's run without the loss, and the epochs trained again (the checkpoint
seen when the Pod went, less the epoch the run resumed from: 0 means only
the epoch in progress was lost). Rounds interleave the three runs."""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

from rich.console import Console

from kubeloop.dev.platform import Platform
from tests.bench.realnode import on_a_real_node
from tests.bench.repeat import figures, figures_table

EPOCHS = 6
BATCH = 64
ROUNDS = 2
INDEX = "batch.kubernetes.io/job-completion-index"
STEP = "jobset.sigs.k8s.io/replicatedjob-name"


def run(context, console: Console, quick: bool = False) -> dict:  # noqa: ANN001 - the bench's Context
    return on_a_real_node("trainer", console, lambda platform, tmp: _measure(platform, tmp, console,
                                                                              1 if quick else ROUNDS))


def _measure(platform: Platform, tmp: Path, console: Console, rounds: int) -> dict:
    import boto3

    from tests.support.trainjobs import TrainerCluster

    os.environ.update({k: v for k, v in platform.env().items() if k.startswith(("AWS_", "FEAST_"))})
    boto3.DEFAULT_SESSION = None  # the platform's keys, not another suite's
    kube = platform.kube()
    namespace = f"bench-{uuid.uuid4().hex[:6]}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    with console.status("trainer: the training image, Trainer and the published store"):
        cluster = TrainerCluster(platform, kube, namespace, tmp)
    results = []
    try:
        with console.status("trainer: a first local run, unmeasured (it starts the platform's fork server)"):
            _timed(cluster, "warm-up", "local")
        for i in range(rounds):
            with console.status(f"trainer: round {i + 1} of {rounds}"):
                local, trainer = _timed(cluster, f"local-{i}", "local"), _timed(cluster, f"trainer-{i}", "trainer")
                lost = _timed(cluster, f"lost-{i}", "trainer", lose_node=True, tmp=tmp)
            results.append({
                "started_local": local["started"], "started_trainer": trainer["started"],
                "started_ratio": trainer["started"] / local["started"],
                "total_local": local["total"], "total_trainer": trainer["total"],
                "total_ratio": trainer["total"] / local["total"],
                "total_node_lost": lost["total"], "node_lost_cost": lost["total"] - trainer["total"],
                "epochs_repeated": lost["at_loss"] - lost["resumed"]})
    finally:
        cluster.close()
        kube.close()
    rows = figures(results, {"started_local": "s", "started_trainer": "s", "started_ratio": "x", "total_local": "s",
                             "total_trainer": "s", "total_ratio": "x", "total_node_lost": "s",
                             "node_lost_cost": "s", "epochs_repeated": "epochs"})
    console.print(figures_table(f"trainer backend against local: the fraud TrainingJob, 2 nodes, {EPOCHS} epochs, "
                                f"batch {BATCH}", rows))
    return {f.name: f.to_json() for f in rows}


NODES_ACTIVE = re.compile(r"(^|; )node: [^;]*\bactive")


def _started(status: dict, backend: str) -> bool:
    """The training step under way: the local run's train step (not
    training-data), or the TrainJob's node Jobs (not the initializer's)."""
    progress = next((c.get("message", "") for c in status.get("conditions", []) if c["type"] == "RunSucceeded"), "")
    return progress == "running step train" if backend == "local" else bool(NODES_ACTIVE.search(progress))


def _timed(cluster, name: str, backend: str, lose_node: bool = False,  # noqa: ANN001 - a TrainerCluster
           tmp: Path | None = None) -> dict:
    from mlflow import MlflowClient

    applied, started, at_loss = time.monotonic(), None, None
    cluster.kube.create(cluster.trainingjob(name, EPOCHS, BATCH, backend))
    while (status := cluster.status(name)).get("phase") not in ("Succeeded", "Failed"):
        if started is None and _started(status, backend):
            started = time.monotonic() - applied
        if lose_node and at_loss is None:
            at_loss = _lose_a_node(cluster, status, tmp)
        if time.monotonic() - applied > 1800:
            raise TimeoutError(f"TrainingJob {name} still {status.get('phase')} after 30 minutes: {status}")
        time.sleep(0.25)
    total = time.monotonic() - applied
    if status["phase"] != "Succeeded" or started is None:
        raise RuntimeError(f"TrainingJob {name} on {backend}: {status}")
    (version,) = cluster.versions(name)
    tags = MlflowClient(cluster.env["MLFLOW_TRACKING_URI"]).get_run(version.run_id).data.tags
    return {"started": started, "total": total, "at_loss": at_loss or 0,
            "resumed": int(tags.get("train.resumed_from_epoch", 0))}


def _lose_a_node(cluster, status: dict, tmp: Path) -> int | None:  # noqa: ANN001 - a TrainerCluster
    """Delete node 1's Pod once rank 0 has published a checkpoint; the epoch
    of that checkpoint, or None while there is none."""
    import torch

    from kubeloop.components.objects import download
    from kubeloop.components.training import SHARED_CHECKPOINT

    run_id = status.get("runId")
    if not run_id:
        return None
    trainjob = cluster.kube.get("trainer.kubeflow.org/v1alpha1", "TrainJob", run_id.split("/")[1], cluster.namespace)
    run = (trainjob or {}).get("metadata", {}).get("annotations", {}).get("kubeloop.dev/pipeline-run")
    local = run and download(f"s3://training/{cluster.namespace}/{run}/checkpoints/{SHARED_CHECKPOINT}",
                             tmp / "checkpoint.pt", missing_ok=True)
    if not local:
        return None
    epoch = torch.load(local, map_location="cpu", weights_only=True)["epoch"]
    for pod in cluster.pods(run_id.split("/")[1]):
        labels = pod["metadata"]["labels"]
        if labels.get(STEP) == "node" and labels.get(INDEX) == "1" and pod["status"]["phase"] == "Running":
            cluster.kube.delete("v1", "Pod", pod["metadata"]["name"], cluster.namespace)
            return epoch
    return None
