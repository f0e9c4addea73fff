"""Fleet suite: how often the operator LISTs every Pod in the cluster while
it keeps N GPU InferenceServices converged on the fake fleet (apart from
the LISTs of each service's own Pods, one namespace by label, which the
serving backend makes to report their state).

The operator runs with a ServiceAccount's token, so the API server's audit
log records each of its requests. Baseline, in the same run: the GPU
InferenceService reconciles in the same window (one GET of the object each);
reading the fleet with a LIST per reconcile would list Pods that often. The
figures are per minute over five consecutive windows.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import yaml
from mlflow import MlflowClient
from rich.console import Console
from rich.table import Table

from kubeloop.api.constants import API_VERSION, GROUP
from kubeloop.dev.binaries import binary
from kubeloop.dev.platform import build_kubeconfig
from kubeloop.polling import wait_for
from tests.bench.repeat import Figure, figures, figures_table
from tests.support.operator import OperatorProcess

WINDOWS = 5
GPU = {"sharing": "mps", "mps": {"activeThreadPercentage": 25}, "memoryMib": 2048}


def _service_account(platform, kube, namespace: str, workdir: Path) -> tuple[Path, str]:
    """A kubeconfig with a ServiceAccount's token (bound to cluster-admin on this throwaway platform)."""
    name = "fleet-bench"
    kube.apply({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}})
    kube.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{namespace}-{name}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    token = subprocess.run([str(binary("kubectl")), f"--kubeconfig={platform.kubeconfig}", "create", "token", name,
                            "-n", namespace, "--duration=2h"], capture_output=True, text=True, check=True).stdout
    user = f"system:serviceaccount:{namespace}:{name}"
    config = workdir / "bench.kubeconfig"
    config.write_text(yaml.safe_dump(build_kubeconfig(kube.server, platform.pki.ca_cert, token.strip(), user)))
    return config, user


def _model(platform, namespace: str) -> str:
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    name = f"{namespace}-fleet"
    client.create_registered_model(name)
    version = client.create_model_version(name, source=f"s3://models/{name}/1")
    client.set_registered_model_alias(name, "champion", version.version)
    return name


def _isvc(namespace: str, name: str, model: str) -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": model, "alias": "champion"}, "backend": "kubernetes",
                     "resources": {"cpu": "10m", "memory": "32Mi"}, "gpu": GPU}}


def _requests(audit: Path, offset: int, user: str) -> tuple[int, list[dict]]:
    """The user's audit events written after byte offset, and the new offset."""
    with audit.open("rb") as log:
        log.seek(offset)
        data = log.read()
    complete = data[:data.rfind(b"\n") + 1]
    events = [json.loads(line) for line in complete.splitlines() if line.strip()]
    return offset + len(complete), [e for e in events if e["user"]["username"] == user]


def _count(events: list[dict], verb: str, resource: str, group: str = "", cluster_wide: bool | None = None) -> int:
    """Completed requests; cluster_wide picks LISTs of every namespace (True)
    or of one namespace (False)."""
    return sum(1 for e in events if e["verb"] == verb and e.get("stage") == "ResponseComplete"
               and (ref := e.get("objectRef", {})).get("resource") == resource and ref.get("apiGroup", "") == group
               and (cluster_wide is None or cluster_wide != bool(ref.get("namespace"))))


def measure(platform, count: int, workdir: Path, window: float) -> list[dict]:
    kube = platform.kube()
    namespace = f"fleet-{uuid.uuid4().hex[:6]}"
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    config, user = _service_account(platform, kube, namespace, workdir)
    model = _model(platform, namespace)
    op = OperatorProcess(config, workdir / "operator", {
        "KUBELOOP_REGISTRY": "mlflow", "MLFLOW_TRACKING_URI": platform.env()["MLFLOW_TRACKING_URI"],
        "KUBELOOP_SERVING_BACKENDS": "kubernetes", "KUBELOOP_SERVING_BACKEND": "kubernetes",
        "KUBELOOP_PIPELINE_BACKENDS": "noop", "KUBELOOP_PIPELINE_BACKEND": "noop",
        "KUBELOOP_WORK_DIR": str(workdir / "work")}, [namespace]).start()
    try:
        op.wait_for_log("Initial authentication has finished", timeout=60)
        for i in range(count):
            kube.create(_isvc(namespace, f"gpu-{i:04d}", model))

        def placed() -> int:
            return sum(1 for o in kube.list(API_VERSION, "InferenceService", namespace)
                       if (o.get("status") or {}).get("placement"))

        wait_for(lambda: placed() == count, timeout=max(300, count * 2), interval=2,
                 what=f"all {count} InferenceServices placed", seen=lambda: f"{placed()} placed")
        offset, _ = _requests(platform.audit_log, 0, user)
        rows = []
        for _ in range(WINDOWS):
            started = time.monotonic()
            time.sleep(window)
            offset, events = _requests(platform.audit_log, offset, user)
            per_minute = 60 / (time.monotonic() - started)
            rows.append({"pod_lists_per_min": _count(events, "list", "pods", cluster_wide=True) * per_minute,
                         "own_pod_lists_per_min": _count(events, "list", "pods", cluster_wide=False) * per_minute,
                         "node_lists_per_min": _count(events, "list", "nodes") * per_minute,
                         "reconciles_per_min": _count(events, "get", "inferenceservices", GROUP) * per_minute})
        return rows
    finally:
        op.stop()
        kube.delete("v1", "Namespace", namespace)
        kube.delete("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", f"{namespace}-fleet-bench")


FIGURES = {"pod_lists_per_min": "/min", "own_pod_lists_per_min": "/min", "node_lists_per_min": "/min",
           "reconciles_per_min": "/min"}


def run(context, console: Console, quick: bool = False) -> list[dict]:
    import tempfile

    count, window = (40, 20.0) if quick else (200, 60.0)
    platform = context.platform
    if not platform.audit_log.exists():
        raise RuntimeError("this platform was started without audit logging; restart it")
    with console.status(f"fleet: {count} GPU InferenceServices, {WINDOWS} windows of {window:.0f} s"):
        with tempfile.TemporaryDirectory() as tmp:
            windows = measure(platform, count, Path(tmp), window)
    repeated: list[Figure] = figures(windows, FIGURES)
    medians = {f.name: round(f.median, 1) for f in repeated}
    baseline = medians["reconciles_per_min"]
    row = {"inference_services": count, **medians,
           "pod_lists_vs_per_reconcile_read": round(medians["pod_lists_per_min"] / baseline, 3) if baseline else None,
           "repeated": {f.name: f.to_json() for f in repeated}}
    table = Table(title="Fleet reads: Pod LISTs while the operator keeps GPU InferenceServices converged")
    for column in ("GPU InferenceServices", "cluster-wide Pod LISTs /min", "Node LISTs /min",
                   "reconciles /min (= cluster-wide Pod LISTs /min of a per-reconcile read)", "Pod LISTs / baseline",
                   "own Pods' LISTs /min (one namespace, by label)"):
        table.add_column(column, justify="right")
    table.add_row(str(count), str(row["pod_lists_per_min"]), str(row["node_lists_per_min"]),
                  str(row["reconciles_per_min"]), f"{row['pod_lists_vs_per_reconcile_read']}x",
                  str(row["own_pod_lists_per_min"]))
    console.print(table)
    console.print(figures_table("fleet: each figure over the windows", repeated))
    return [row]
