"""`kubeloop demo`: the whole loop on this machine, told as a timeline.

A fresh platform, the operator, the examples; then traffic, drift, the
alert, the retrain, its gate, canary and promotion. Every hop checks that
what it claims really happened (see kubeloop.story.loop); the demo exits 1
at the first that did not.
"""

from __future__ import annotations

import os
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer
import yaml
from rich.console import Console
from rich.table import Table

from kubeloop.api.conditions import ConditionType
from kubeloop.api.constants import API_VERSION
from kubeloop.paths import repo_root
from kubeloop.dev.platform import Platform, PlatformError, default_state_dir

console = Console()
MODEL = "fraud-detector"


class Story(str, Enum):
    drift = "drift"
    outcomes = "outcomes"


def load_examples(folder: Path) -> list[dict]:
    docs = []
    for path in sorted(folder.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d and d.get("apiVersion") == API_VERSION]
    # The order the story needs them in: what is trained, optimised, then served.
    order = {"TrainingJob": 0, "OptimizedModel": 1, "InferenceService": 2}
    return sorted(docs, key=lambda d: order.get(d["kind"], 3))


def demo(
    state_dir: Annotated[Optional[Path], typer.Option(
        help="Where the demo's platform keeps its state (replaced on every run, so the story starts from "
             "nothing).")] = None,
    namespace: Annotated[str, typer.Option(help="Namespace for the example objects.")] = "kubeloop-demo",
    scale: Annotated[float, typer.Option(help="Multiply every wait (slow machines).")] = 1.0,
    cluster: Annotated[bool, typer.Option(
        "--cluster", help="Run the loop in Pods on a real node, as a cluster does: training in Kubeflow Trainer "
                          "TrainJobs, optimisation, materialisation and drift checks as Jobs, serving through "
                          "KServe and kubeloop's front, from a published store, the operator as the chart's Pod (changes the "
                          "host, see README).")] = False,
    story: Annotated[Story, typer.Option(
        help="drift: the inputs drift, Evidently sees it, retrain; outcomes: the labels arrive late and "
             "the label function changes while the inputs do not, the live AUC falls, retrain, roll out "
             "step by step on live metrics, and abort a worse challenger.")] = Story.drift,
) -> None:
    """Run the loop on this machine: train, optimise, serve, drift, alert, retrain, gate, canary, promote."""
    from kubeloop.registry.mlflow import MlflowRegistry, fail_fast
    from kubeloop.story.loop import Loop, StepFailed, Timings, operator_env, prepare

    if cluster and story is Story.outcomes:
        raise typer.BadParameter(
            "the outcome story runs on the local path only: its callers' labels arrive in a folder on this "
            "machine, which the cluster's Pods (its outcome Jobs, the operator) cannot read. Run `kubeloop demo "
            "--story outcomes`, or `kubeloop demo --cluster` for the drift story.", param_hint="--story")
    platform = Platform(state_dir or default_state_dir().parent / ("demo-cluster" if cluster else "demo"),
                        real_node=cluster)
    started = time.monotonic()

    def show(title: str, action) -> str:  # noqa: ANN001 - a hop
        at = time.monotonic() - started
        with console.status(f"[bold]{title}[/bold]"):
            try:
                detail = action()
            except (StepFailed, PlatformError) as exc:
                console.print(f"[red]✗[/red] [dim]{at:6.1f}s[/dim] {title}\n  [red]{exc}[/red]")
                raise
        console.print(f"[green]✓[/green] [dim]{at:6.1f}s[/dim] [bold]{title}[/bold]\n  [dim]{detail}[/dim]")
        return detail

    loop = None
    try:
        show("a fresh platform: etcd, Kubernetes, KWOK GPU fleet, MLflow, Feast, Prometheus, Alertmanager",
             lambda: _fresh_platform(platform))
        _log_to(platform.logs / "demo.log")
        env = platform.env()
        repo, reach, publish, cluster_settings = Path(env["KUBELOOP_FEAST_REPO"]), None, None, {}
        if cluster:
            from kubeloop.featurestore.publish import upload_sources
            from kubeloop.story.cluster import Endpoints, client_env

            os.environ.update(client_env(env))  # this process writes the published store and uploads the drift
            path = _cluster_path(platform, namespace, show)
            repo, reach, cluster_settings = path.repo, Endpoints(platform.kube()), path.settings
            publish = lambda: upload_sources(path.repo, path.sources)  # noqa: E731
        settings = {**operator_env(env, repo, platform.dir / "operator"), **cluster_settings}
        timings = Timings()
        docs = prepare(load_examples(repo_root() / "examples"), namespace, MODEL, timings)
        if cluster:
            from kubeloop.story.cluster import on_the_real_node

            docs = on_the_real_node(docs)
        if cluster:
            from kubeloop.story.chart import ChartOperator

            chart = ChartOperator(platform, namespace)
            show("the kubeloop operator: kubeloop's chart, its Pod on the real node",
                 lambda: _install_chart(chart, cluster_settings))
        else:
            show("the kubeloop operator", lambda: _start_operator(platform, settings))
        fail_fast()
        if story is Story.outcomes:
            from kubeloop.story.outcomes import OutcomeLoop, outcome_docs

            labels = platform.dir / "labels" / namespace
            loop = OutcomeLoop(platform.kube(), MlflowRegistry(env["MLFLOW_TRACKING_URI"]), env,
                               outcome_docs(docs, labels, OutcomeLoop.outcome_timings), repo, scale=scale,
                               reach=reach, publish=publish, labels_dir=labels)
        else:
            loop = Loop(platform.kube(), MlflowRegistry(env["MLFLOW_TRACKING_URI"]), env, docs, repo, scale=scale,
                        reach=reach, entities=True, publish=publish)
        console.print(f"  [dim]demo timings: drift checked every {timings.schedule} over the last {timings.window}; "
                      f"canary for {timings.canary_duration}[/dim]")
        for title, step in loop.steps():
            show(title, step)
    except (StepFailed, PlatformError):
        operator_log = (f"kubectl logs -n {namespace} deployment/kubeloop" if cluster
                        else platform.logs / "operator.log")
        console.print(f"\nlogs: {platform.logs} (the operator's: {operator_log}, "
                      f"this command's: {platform.logs / 'demo.log'})")
        raise typer.Exit(1) from None
    finally:
        if loop:
            loop.stop()
    _summary(platform, loop, namespace, time.monotonic() - started)


def _log_to(path: Path) -> None:
    """Library logs and warnings (Feast, dask, MLflow) go to a file, so the timeline stays readable."""
    import logging

    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    logging.captureWarnings(True)


def _cluster_path(platform: Platform, namespace: str, show):  # noqa: ANN001, ANN202 - a hop printer; a ClusterPath
    from kubeloop.story.cluster import prepare_cluster

    found = []

    def prepared() -> str:
        found.append(prepare_cluster(platform, namespace, platform.dir / "published-store"))
        settings = found[0].settings
        return (f"KServe v0.20 in namespace kserve, Kubeflow Trainer and JobSet; training on "
                f"{settings['KUBELOOP_TRAINING_IMAGE']}, the front on {settings['KUBELOOP_ROUTER_IMAGE']}, Triton on "
                f"{settings['KUBELOOP_TRITON_IMAGE']}; the store published to {found[0].sources} with its online "
                "store in Redis; drift checks and materialisation as Jobs")

    show("the cluster path: KServe, Kubeflow Trainer, kubeloop's images and the published store on the real node",
         prepared)
    return found[0]


def _fresh_platform(platform: Platform) -> str:
    if platform.dir.exists():
        platform.down()
    state = platform.up()
    return f"ready in {state.ready_seconds} s; state in {platform.dir}"


def _start_operator(platform: Platform, env: dict[str, str]) -> str:
    import requests

    from kubeloop.story.loop import wait_until

    record = platform.start_process("operator", [sys.executable, "-m", "kubeloop.cli", "operator"], env=env)
    health = f"http://127.0.0.1:{env['KUBELOOP_WEBHOOK_PORT']}/healthz"

    def healthy() -> bool:
        if not record.running():
            raise PlatformError(f"the operator exited; see {record.log}")
        try:
            return requests.get(health, timeout=1).status_code == 200
        except requests.RequestException:
            return False

    wait_until(healthy, 60, "the operator's start-up", interval=0.5)
    return f"pid {record.pid}; webhooks and /metrics on 127.0.0.1:{env['KUBELOOP_WEBHOOK_PORT']}; log {record.log}"


def _install_chart(chart, settings: dict[str, str]) -> str:  # noqa: ANN001 - kubeloop.story.chart.ChartOperator
    image = chart.install(settings)
    pod = chart.wait_answering()
    return (f"Pod {pod['metadata']['name']} from {image}; Alertmanager and MLflow call its webhooks through "
            f"the NodePort 127.0.0.1:{chart.platform.env()['KUBELOOP_WEBHOOK_PORT']}")


def _summary(platform: Platform, loop, namespace: str, took: float) -> None:  # noqa: ANN001 - Loop
    table = Table("kind", "name", "phase", "why", title="what the operator made")
    for kind in ("TrainingJob", "OptimizedModel", "InferenceService"):
        for obj in platform.kube().list(API_VERSION, kind, namespace):
            conditions = obj.get("status", {}).get("conditions", [])
            ready = next((c for c in conditions if c["type"] == ConditionType.READY), {})
            table.add_row(kind, obj["metadata"]["name"], obj.get("status", {}).get("phase", ""),
                          ready.get("message") or ready.get("reason", ""))
    console.print(table)
    env, facts = platform.env(), loop.facts
    report = Path(platform.dir / "operator" / "monitoring" / f"{namespace}-{loop.service['metadata']['name']}"
                  / "report.html")
    if not report.exists():  # the cluster path's drift Jobs keep their reports in MLflow alone
        report = "-"
    console.print(
        f"\n[bold]The loop closed in {took:.0f} s[/bold]; drift injection to the promoted model serving: "
        f"{facts['injection_to_promoted']:.0f} s.\n{_latency(loop)}\n\n[bold]Where to look[/bold]\n"
        f"  eval $(kubeloop dev env --state-dir {platform.dir})\n"
        f"  kubectl get trainingjobs,optimizedmodels,inferenceservices -n {namespace}\n"
        f"  kubectl describe inferenceservice {loop.service['metadata']['name']} -n {namespace}\n"
        f"  kubeloop audit {loop.model}\n"
        f"  MLflow:       {env['MLFLOW_TRACKING_URI']}/#/models/{loop.model}\n"
        f"  Prometheus:   {env['PROMETHEUS_URL']}/graph?g0.expr=kubeloop_drift_share  (alerts: /alerts; "
        "kubeloop_online_feature_retrieval_seconds, kubeloop_online_features_lag_seconds)\n"
        f"  Alertmanager: {env['ALERTMANAGER_URL']}/#/alerts\n"
        f"  drift report: {report}  (and in MLflow: {facts.get('drift', {}).get('report', '-')})\n"
        + (f"  outcomes:     {facts['decayed_performance'].get('report')}  (kubectl get inferenceservice "
           f"-o jsonpath='{{.status.performance}}'; kubeloop_live_metric in Prometheus)\n"
           if "decayed_performance" in facts else "") +
        f"  logs:         {platform.logs}\n"
        f"  stop it all:  kubeloop dev down --state-dir {platform.dir}")


def _latency(loop) -> str:  # noqa: ANN001 - Loop
    """What callers waited, and (entity requests) what the online-feature
    retrieval took of it, as the front's histogram in Prometheus has it."""
    callers = loop.traffic.latency_ms() if loop.traffic else {}
    line = (f"Requests ({loop.traffic.batch} rows each, {loop._sending()}): p50 {callers['p50']:.1f} ms, "
            f"p99 {callers['p99']:.1f} ms as callers waited" if callers else "No request was answered")
    retrieval = loop.retrieval_latency()
    if retrieval:
        line += (f"; online feature retrieval p50 {retrieval['p50']:.2f} ms, p99 {retrieval['p99']:.2f} ms "
                 "(Prometheus, interpolated within the histogram's buckets)")
    return line + "."
