"""Training in real Pods through Kubeflow Trainer on the real node (a
platform of its own, since the shared one is fake-only), kubeloop's TrainJob
on data its pipeline prepared (as the kfp step makes it): one node against
two (samples/s as rank 0 reports it, the world's total), apply to the first
published checkpoint, and apply to complete. Rounds interleave the two
runs; ROUNDS of them, not repeat.RUNS, since one round holds the real node
for about two minutes. Each node Pod is limited to 500m of this machine's
two cores, so two nodes have twice one node's CPU: against that linear 2x,
the ratio shows what the rendezvous and gloo's all-reduce cost, not a
cluster's scaling. samples/s is rank 0's rate times the world size."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

from rich.console import Console
from rich.table import Table

from kubeloop.dev import trainer
from kubeloop.dev.images import PYTHON_IMAGES, python_image
from kubeloop.dev.platform import Platform
from tests.bench.realnode import on_a_real_node
from tests.bench.repeat import figures, figures_table, repeat
from tests.support.trainjobs import TrainJobs

EPOCHS = 4
ROUNDS = 3


def run(context, console: Console, quick: bool = False) -> dict:  # noqa: ANN001 - the bench's Context
    return on_a_real_node("trainjob", console, lambda platform, tmp: _measure(platform, tmp, console,
                                                                               1 if quick else ROUNDS))


def _measure(platform: Platform, tmp: Path, console: Console, runs: int) -> dict:
    image = python_image(PYTHON_IMAGES["training"], [sys.executable, "-m", "pip"])
    platform.import_image(image)
    trainer.install(platform, image.ref)
    kube = platform.kube()
    # This process publishes each run's data, as the kfp step does in its Pod.
    os.environ.update({k: v for k, v in platform.env().items() if k.startswith("AWS_")})
    try:
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        jobs = TrainJobs(kube, platform.env(), namespace, image.ref, tmp)

        def round_(i: int) -> dict:
            with console.status(f"trainjob: round {i + 1} of {runs}"):
                one, two = jobs.run(f"one-{i}", 1, EPOCHS), jobs.run(f"two-{i}", 2, EPOCHS)
            return {"one_node": one.result["samples_per_second"], "two_nodes": two.result["samples_per_second"],
                    "two_over_one": two.result["samples_per_second"] / one.result["samples_per_second"],
                    "first_checkpoint_one": one.first_checkpoint_s, "first_checkpoint_two": two.first_checkpoint_s,
                    "complete_one": one.total_s, "complete_two": two.total_s}
        rows = figures(repeat(round_, runs), {
            "one_node": "samples/s", "two_nodes": "samples/s", "two_over_one": "x", "first_checkpoint_one": "s",
            "first_checkpoint_two": "s", "complete_one": "s", "complete_two": "s"})
    finally:
        kube.close()
    table = Table(title=f"TrainJobs on the real node ({EPOCHS} epochs, 32,000 rows, batch 32, 500m CPU a node)")
    for column in ("measure", "median"):
        table.add_column(column)
    for f in rows:
        table.add_row(f.name, f"{f.median:,.3g} {f.unit}")
    console.print(table)
    console.print(figures_table("trainjob: the rounds' figures", rows))
    return {f.name: f.to_json() for f in rows}
