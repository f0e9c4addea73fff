"""`kubeloop dev`: the local platform."""

from __future__ import annotations

import os
import shlex
from enum import Enum
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
from rich.console import Console
from rich.table import Table

from kubeloop.dev.onlinestore import OnlineStoreKind
from kubeloop.dev.platform import Platform, PlatformError

app = typer.Typer(no_args_is_help=True, help="Run the whole platform on this machine.")
console = Console(stderr=True)
StateDir = Annotated[Optional[Path], typer.Option("--state-dir", envvar="KUBELOOP_STATE_DIR",
                                                  help="Where the platform keeps its state and logs.")]


class Nodes(str, Enum):
    fake = "fake"
    real = "real"


def nodes_from_env() -> Nodes:
    """KUBELOOP_REAL_NODE=1 (or true/yes) asks for the real node by default."""
    return Nodes.real if os.environ.get("KUBELOOP_REAL_NODE", "").lower() in ("1", "true", "yes") else Nodes.fake


@app.command()
def up(state_dir: StateDir = None,
       nodes: Annotated[Optional[Nodes], typer.Option(
           help="fake: KWOK's nodes only. real: also one real node (containerd, kubelet, kube-proxy) that runs "
                "the CPU Pods; changes the host (see README). Default: real if KUBELOOP_REAL_NODE=1.")] = None,
       online_store: Annotated[OnlineStoreKind, typer.Option(
           envvar="KUBELOOP_ONLINE_STORE",
           help="Where the example feature repository keeps online features: sqlite (a file in the repository) "
                "or redis (Debian's redis-server, started on loopback).")] = OnlineStoreKind.sqlite,
       ) -> None:
    """Start etcd, the Kubernetes control plane and KWOK's fake GPU fleet,
    and with --nodes real a real node beside it."""
    platform = Platform(state_dir, real_node=(nodes or nodes_from_env()) is Nodes.real, online_store=online_store)
    try:
        with console.status("starting the platform") as status:
            platform.up(progress=lambda msg: status.update(msg))
    except PlatformError as exc:
        console.print(f"[red]the platform did not come up:[/red] {exc}")
        raise typer.Exit(1) from None
    state = platform.state()
    console.print(f"[green]platform up[/green] in {state.ready_seconds} s; "
                  f"run [bold]eval $(kubeloop dev env)[/bold]")


@app.command()
def down(state_dir: StateDir = None) -> None:
    """Stop every process `up` started, undo the real node's changes to the
    host, and remove the state."""
    try:
        Platform(state_dir).down()
    except PlatformError as exc:
        console.print(f"[red]the platform did not come down cleanly:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print("platform down")


@app.command()
def status(state_dir: StateDir = None) -> None:
    """Show each platform process."""
    platform = Platform(state_dir)
    rows = platform.status()
    if not rows:
        console.print("the platform is not up")
        raise typer.Exit(1)
    table = Table("component", "state", "pid", "log")
    for name, row in rows.items():
        table.add_row(name, "[green]running[/green]" if row["running"] else "[red]stopped[/red]",
                      str(row["pid"]), row["log"])
    node = platform.node_status()
    if node:
        table.add_row(f"node {node['name']}", "[green]Ready[/green]" if node["ready"] else "[red]NotReady[/red]",
                      "", node["message"])
    Console().print(table)
    if not all(r["running"] for r in rows.values()) or (node and not node["ready"]):
        raise typer.Exit(1)


@app.command()
def images(names: Annotated[Optional[list[str]], typer.Argument(
               help="Images to build: pause, base, operator, runtime, training, triton (default: all).")] = None,
           state_dir: StateDir = None,
           load: Annotated[bool, typer.Option("--import", help="Also import them into the real node's containerd "
                                              "(the platform must be up with --nodes real).")] = False) -> None:
    """Build kubeloop's images without Docker (Debian root + the project's
    packages, assembled with umoci), cached under ~/.cache/kubeloop/images
    by their inputs; Pods use them with imagePullPolicy Never."""
    import sys

    from kubeloop.dev.images import ImageError, build_all

    try:
        built = build_all([sys.executable, "-m", "pip"], names)
    except ImageError as exc:
        console.print(f"[red]image build failed:[/red] {exc}")
        raise typer.Exit(1) from None
    platform = Platform(state_dir)
    table = Table("image", "MB", "seconds")
    for image, seconds in built:
        if load:
            platform.import_image(image)
        table.add_row(image.ref, f"{image.archive.stat().st_size / 2**20:.0f}", f"{seconds:.1f}")
    Console().print(table)


@app.command()
def kserve(state_dir: StateDir = None) -> None:
    """Install KServe (its v0.20 controller manager, built from its Go
    module, as a Pod; its CRDs, configuration and webhooks) onto a platform
    up with --nodes real, for the kserve serving backend. Idempotent."""
    from kubeloop.dev.kserve import KServeError, install

    _install_on_the_real_node(state_dir, "KServe", install, KServeError)
    console.print("[green]KServe installed[/green]: set KUBELOOP_SERVING_BACKENDS=kserve,... for the operator")


@app.command()
def trainer(state_dir: StateDir = None) -> None:
    """Install Kubeflow Trainer v2.3 and the JobSet controller it runs on
    (both built from their Go modules, run as Pods in kubeflow-system; their
    CRDs and webhooks) onto a platform up with --nodes real, with kubeloop's
    ClusterTrainingRuntime `kubeloop-training` on kubeloop's training image
    (built and imported first). Idempotent."""
    import sys

    from kubeloop.dev.images import PYTHON_IMAGES, ImageError, python_image
    from kubeloop.dev.trainer import TrainerError, install

    def with_image(platform: Platform, progress: Callable[[str], None]) -> None:
        progress("kubeloop's training image (torch; the first build takes minutes)")
        try:
            image = python_image(PYTHON_IMAGES["training"], [sys.executable, "-m", "pip"])
        except ImageError as exc:
            raise TrainerError(f"the training image: {exc}") from None
        platform.import_image(image)
        install(platform, image.ref, progress)

    _install_on_the_real_node(state_dir, "Kubeflow Trainer", with_image, TrainerError)
    console.print("[green]Kubeflow Trainer installed[/green]: TrainJobs on the kubeloop-training runtime run "
                  "on the real node")


@app.command("metrics-adapter")
def metrics_adapter(state_dir: StateDir = None) -> None:
    """Serve the custom metrics API (custom.metrics.k8s.io) from the
    platform's Prometheus: prometheus-adapter, built from its Go module, with
    the chart's rules, on the real node's address behind an APIService, so
    the HPA controller scales InferenceServices on Triton's metrics. Needs a
    platform up with --nodes real; `kubeloop dev down` stops it."""
    from kubeloop.dev.metricsadapter import MetricsAdapterError, install

    _install_on_the_real_node(state_dir, "the custom metrics API", install, MetricsAdapterError)
    console.print("[green]custom metrics API up[/green]: "
                  "kubectl get --raw /apis/custom.metrics.k8s.io/v1beta1 lists the metrics Prometheus has")


def _install_on_the_real_node(state_dir: Optional[Path], what: str, install: Callable,
                              error: type[Exception]) -> None:
    """Run an installer against a platform up with the real node; exit 1
    naming what failed."""
    platform = Platform(state_dir)
    state = platform.state()
    if not state or not state.real_node:
        console.print(f"[red]{what} needs the real node:[/red] run `kubeloop dev up --nodes real` first")
        raise typer.Exit(1)
    try:
        with console.status(f"installing {what}") as status:
            install(platform, progress=lambda msg: status.update(msg))
    except error as exc:
        console.print(f"[red]{what} did not come up:[/red] {exc}")
        raise typer.Exit(1) from None


@app.command()
def env(state_dir: StateDir = None) -> None:
    """Print `export` lines for the platform: KUBECONFIG, service URLs, and a
    PATH that puts the pinned kubectl and helm first."""
    platform = Platform(state_dir)
    values = platform.env()
    if not values:
        console.print("the platform is not up")
        raise typer.Exit(1)
    values["PATH"] = platform.tool_path()
    for key, value in values.items():
        print(f"export {key}={shlex.quote(value)}")
