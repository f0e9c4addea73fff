"""`kubeloop demo`: bring the platform up and show the loop, step by step.

Every step checks that what it claims really happened; the demo exits
non-zero at the first step that did not.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer
import yaml
from rich.console import Console
from rich.table import Table

from kubeloop.api.constants import API_VERSION
from kubeloop.dev.binaries import repo_root
from kubeloop.dev.platform import Platform

console = Console()


class StepFailed(Exception):
    """A demo step did not happen."""


@dataclass
class Timeline:
    """A readable, timed log of the story."""

    started: float = field(default_factory=time.monotonic)

    def step(self, title: str, action: Callable[[], str | None]) -> None:
        at = time.monotonic() - self.started
        with console.status(f"[bold]{title}[/bold]"):
            try:
                detail = action()
            except StepFailed as exc:
                console.print(f"[red]✗[/red] [dim]{at:6.1f}s[/dim] {title}: {exc}")
                raise
        console.print(f"[green]✓[/green] [dim]{at:6.1f}s[/dim] {title}" + (f" [dim]— {detail}[/dim]" if detail else ""))


def wait_until(probe: Callable[[], object], timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(interval)
    raise StepFailed(f"{what} did not happen within {timeout:.0f} s")


def load_examples(folder: Path) -> list[dict]:
    docs = []
    for path in sorted(folder.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("apiVersion") == API_VERSION]
    return docs


def demo(
    state_dir: Annotated[Optional[Path], typer.Option(envvar="KUBELOOP_STATE_DIR",
                                                      help="Where the platform keeps its state.")] = None,
    namespace: Annotated[str, typer.Option(help="Namespace for the example objects.")] = "kubeloop-demo",
) -> None:
    """Run the loop on this machine: platform, operator, examples, status."""
    platform = Platform(state_dir)
    timeline = Timeline()
    try:
        timeline.step("start the platform (etcd, Kubernetes, KWOK GPU fleet, MLflow)",
                      lambda: f"ready in {platform.up().ready_seconds} s")
        kube = platform.kube()
        timeline.step("start the kubeloop operator", lambda: _start_operator(platform))
        examples = load_examples(repo_root() / "examples")
        timeline.step(f"apply examples/ to namespace {namespace}", lambda: _apply(kube, namespace, examples))
        timeline.step("operator reports status on every object", lambda: _reported(kube, namespace, examples))
        timeline.step("train: Feast features -> torch -> MLflow (kfp local runner)",
                      lambda: _trained(kube, namespace, examples))
    except StepFailed:
        console.print(f"operator log: {platform.logs / 'operator.log'}")
        raise typer.Exit(1)
    _show(kube, namespace, examples)
    env = platform.env()
    console.print(f"\n[bold]Where to look[/bold]\n  eval $(kubeloop dev env --state-dir {platform.dir})\n"
                  f"  kubectl get kubeloop -n {namespace}\n  kubectl explain inferenceservice.spec.gpu\n"
                  f"  MLflow UI: {env.get('MLFLOW_TRACKING_URI')}\n  logs: {platform.logs}\n"
                  "  stop everything: kubeloop dev down")


def _start_operator(platform: Platform) -> str:
    record = platform.start_process("operator", [sys.executable, "-m", "kubeloop.cli", "operator"], env={
        "KUBELOOP_REGISTRY": "mlflow",
        "KUBELOOP_PIPELINE_BACKENDS": "local,noop",
        "KUBELOOP_PIPELINE_BACKEND": "local",
        "KUBELOOP_WORK_DIR": str(platform.dir / "operator"),
        "KUBELOOP_RESYNC_SECONDS": "5",
    })
    wait_until(lambda: "Initial authentication has finished" in Path(record.log).read_text(errors="replace"),
               60, "operator start-up")
    return f"pid {record.pid}, log {record.log}"


def _apply(kube, namespace: str, examples: list[dict]) -> str:  # noqa: ANN001 - Kube
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for doc in examples:
        kube.apply({**doc, "metadata": {**doc["metadata"], "namespace": namespace}}, field_manager="kubectl")
    return ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in examples)


def _reported(kube, namespace: str, examples: list[dict]) -> str:  # noqa: ANN001
    def all_reported():
        live = [kube.get(d["apiVersion"], d["kind"], d["metadata"]["name"], namespace) for d in examples]
        return all(o and o.get("status", {}).get("conditions") for o in live)

    wait_until(all_reported, 60, "status on every example")
    return f"{len(examples)} objects"


def _trained(kube, namespace: str, examples: list[dict]) -> str:  # noqa: ANN001
    doc = next(d for d in examples if d["kind"] == "TrainingJob")
    name = doc["metadata"]["name"]

    def done():
        obj = kube.get(doc["apiVersion"], "TrainingJob", name, namespace)
        phase = obj.get("status", {}).get("phase")
        return obj if phase in ("Succeeded", "Failed") else None

    status = wait_until(done, 900, f"TrainingJob {name} finishing", interval=2)["status"]
    if status["phase"] != "Succeeded":
        reasons = "; ".join(c["message"] for c in status["conditions"] if c["status"] == "False")
        raise StepFailed(f"TrainingJob {name} failed: {reasons}")
    model = status["model"]
    return f"{model['name']} version {model['version']}, hold-out AUC {status['metrics'].get('auc', 0):.3f}"


def _show(kube, namespace: str, examples: list[dict]) -> None:  # noqa: ANN001
    table = Table("kind", "name", "phase", "ready", "why")
    for doc in examples:
        obj = kube.get(doc["apiVersion"], doc["kind"], doc["metadata"]["name"], namespace)
        ready = next((c for c in obj["status"]["conditions"] if c["type"] == "Ready"), {})
        table.add_row(doc["kind"], doc["metadata"]["name"], obj["status"].get("phase", ""),
                      ready.get("status", ""), ready.get("message") or ready.get("reason", ""))
    console.print(table)
