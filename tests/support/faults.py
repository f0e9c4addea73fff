"""Objects and probes the fault tests share (local backends)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import psutil
import requests
import yaml
from mlflow import MlflowClient

from kubeloop.api.constants import API_VERSION
from kubeloop.pipelines.backends.local import read_state
from tests.support.models import N_FEATURES, register_model

EXAMPLE = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "trainingjob.yaml").read_text())


def training_job(namespace: str, name: str, **changes) -> dict:
    obj = copy.deepcopy(EXAMPLE)
    obj["metadata"] = {"name": name, "namespace": namespace}
    obj["spec"]["modelName"] = f"{namespace}-{name}"
    obj["spec"]["hyperparameters"]["epochs"] = 2
    obj["spec"].update(changes)
    return obj


def inference_service(namespace: str, model: str, name: str = "fraud") -> dict:
    return {"apiVersion": API_VERSION, "kind": "InferenceService", "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": {"name": model, "alias": "champion"}, "backend": "local"}}


def status_of(kube, kind: str, namespace: str, name: str) -> dict:
    return ((kube.get(API_VERSION, kind, name, namespace) or {}).get("status")) or {}


def condition(status: dict, kind: str) -> dict:
    return next((c for c in status.get("conditions", []) if c["type"] == kind), {})


def run_state(work: Path, status: dict) -> dict:
    return read_state(work / "runs" / status["runId"]) if status.get("runId") else {}


def served_processes(work: Path) -> dict[str, int]:
    """How many tritonservers and routers run out of the operator's work folder."""
    counts = {"tritonserver": 0, "router": 0}
    for proc in psutil.process_iter(["cmdline"]):
        line = " ".join(proc.info["cmdline"] or [])
        if str(work) not in line:
            continue
        if "bin/tritonserver" in line:
            counts["tritonserver"] += 1
        elif "kubeloop.front.router" in line:
            counts["router"] += 1
    return counts


def infer(url: str, model: str) -> requests.Response:
    rows = np.zeros((1, N_FEATURES), dtype=np.float32)
    body = {"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32", "data": rows.tolist()}]}
    # The timeout is the bound of "fails fast": a router that hangs raises instead of answering.
    return requests.post(f"{url}/v2/models/{model}/infer", json=body, timeout=10)


def registered_model(platform, namespace: str, name: str) -> str:
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    model = f"{namespace}-{name}"
    version = register_model(uri, model)
    MlflowClient(uri).set_registered_model_alias(model, "champion", version)
    return model
