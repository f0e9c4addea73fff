"""The local platform is a real control plane with the fake GPU fleet, and an
S3 object store (SeaweedFS) holding MLflow's artifacts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import boto3
import mlflow
import psutil
import pytest
import redis
import yaml
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError
from mlflow import MlflowClient

from kubeloop.api.resources import KINDS
from kubeloop.dev import objectstore
from kubeloop.dev.binaries import versions
from kubeloop.dev.platform import Platform
from tests.support.waiting import wait_for

pytestmark = pytest.mark.e2e


def test_server_reports_the_pinned_kubernetes_version(kubectl):
    out = json.loads(kubectl("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"] == versions()["KUBERNETES_VERSION"]
    assert out["serverVersion"]["minor"].startswith("3")


def test_nodes_advertise_nvidia_resources(kubectl):
    nodes = json.loads(kubectl("get", "nodes", "-o", "json").stdout)["items"]
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert set(by_name) == {"gpu-h100-mig-mixed", "gpu-a100-mig-single", "gpu-l4-mps", "gpu-l40s", "cpu-1"}
    for node in nodes:
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
        assert ready == "True", node["metadata"]["name"]
    assert by_name["gpu-h100-mig-mixed"]["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "16"
    assert by_name["gpu-l4-mps"]["status"]["allocatable"]["nvidia.com/gpu"] == "16"


def test_a_mig_pod_is_placed_on_the_h100_by_the_scheduler(kubectl, kube, namespace):
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mig-probe", "namespace": namespace},
        "spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "example.invalid/cuda:1",
                            "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}],
        },
    }
    kube.create(pod)
    running = wait_for(lambda: (p := kube.get("v1", "Pod", "mig-probe", namespace))
                       and p["status"].get("phase") == "Running" and p, what="pod Running")
    assert running["spec"]["nodeName"] == "gpu-h100-mig-mixed"
    # The scheduler records its events asynchronously, after binding.
    wait_for(lambda: any(e["reason"] == "Scheduled" and "gpu-h100-mig-mixed" in e["message"]
                         for e in kube.list("v1", "Event", namespace)), timeout=30, what="the Scheduled event")


def test_a_pod_without_toleration_stays_off_gpu_nodes(kube, namespace):
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cpu-probe", "namespace": namespace},
           "spec": {"containers": [{"name": "c", "image": "example.invalid/x:1"}]}}
    kube.create(pod)
    running = wait_for(lambda: (p := kube.get("v1", "Pod", "cpu-probe", namespace))
                       and p["status"].get("phase") == "Running" and p, what="pod Running")
    assert running["spec"]["nodeName"] == "cpu-1"


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_kubectl_explain_documents_every_kind(kubectl, kind):
    out = kubectl("explain", f"{kind.plural}.spec").stdout
    assert kind.spec.__doc__.split("\n")[0].strip().rstrip(".") in out
    assert "FIELDS:" in out
    deep = kubectl("explain", f"{kind.plural}.status.conditions.reason").stdout
    assert "CamelCase" in deep


# -- the object store (SeaweedFS) ------------------------------------------


def s3_env(platform) -> dict[str, str]:
    return {k: v for k, v in platform.env().items() if k.startswith("AWS_")}


def s3_client(platform, secret: str | None = None):
    env = s3_env(platform)
    credentials = objectstore.Credentials(env["AWS_ACCESS_KEY_ID"], secret or env["AWS_SECRET_ACCESS_KEY"])
    return objectstore.client(env["AWS_ENDPOINT_URL_S3"], credentials, attempts=1)


def test_the_object_store_listens_on_loopback_only(platform):
    """Backend: the platform's real SeaweedFS. Every socket it listens on
    (master, volume, filer, S3, each one's gRPC) is bound to 127.0.0.1."""
    record = next(p for p in platform.state().processes if p.name == "seaweedfs")
    listening = [c.laddr for c in psutil.Process(record.pid).net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN]
    assert {address.port for address in listening} == {platform.state().ports[n] for n in objectstore.PORTS}
    assert {address.ip for address in listening} == {"127.0.0.1"}


def test_the_buckets_exist_and_wrong_credentials_are_refused(platform):
    """Backend: the platform's real SeaweedFS, through boto3."""
    names = {b["Name"] for b in s3_client(platform).list_buckets()["Buckets"]}
    assert {"mlflow", "requests"} <= names
    assert platform.env()["KUBELOOP_REQUEST_LOG"] == "s3://requests"
    with pytest.raises(ClientError) as refused:
        s3_client(platform, secret="not-the-secret").list_objects_v2(Bucket="mlflow")
    assert refused.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    anonymous = boto3.client("s3", endpoint_url=s3_env(platform)["AWS_ENDPOINT_URL_S3"], region_name="us-east-1",
                             config=Config(signature_version=UNSIGNED, retries={"max_attempts": 1}))
    with pytest.raises(ClientError) as denied:
        anonymous.list_objects_v2(Bucket="mlflow")
    assert denied.value.response["Error"]["Code"] == "AccessDenied"


def test_the_s3_secret_is_in_no_log(platform):
    """Backend: the platform's real processes' logs."""
    secret = s3_env(platform)["AWS_SECRET_ACCESS_KEY"]
    assert [p for p in platform.logs.iterdir() if secret in p.read_text(errors="replace")] == []


def test_mlflow_keeps_artifacts_in_the_bucket_and_serves_them_back(platform, tmp_path, monkeypatch):
    """Backend: the platform's real MLflow server with its artifacts in the
    real SeaweedFS. A client with the tracking URI only (no S3 credentials)
    logs an artifact and registers it; runs:/ and models:/ URIs download it
    byte-identical, and the object lies in the `mlflow` bucket."""
    for name in s3_env(platform) | {"MLFLOW_S3_ENDPOINT_URL": ""}:
        monkeypatch.delenv(name, raising=False)
    client = MlflowClient(platform.env()["MLFLOW_TRACKING_URI"])
    payload = os.urandom(300_000)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(payload)
    run = client.create_run(client.create_experiment(f"objectstore-{uuid.uuid4().hex[:8]}"))
    client.log_artifacts(run.info.run_id, str(tmp_path / "model"), "model")
    client.set_terminated(run.info.run_id)
    name = f"objectstore-{uuid.uuid4().hex[:8]}"
    client.create_registered_model(name)
    version = client.create_model_version(name, f"runs:/{run.info.run_id}/model", run_id=run.info.run_id)

    tracking = platform.env()["MLFLOW_TRACKING_URI"]
    # mlflow resolves models:/ through the process's registry URI, whatever
    # registry_uri download_artifacts is given.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking)
    for uri in (f"runs:/{run.info.run_id}/model", f"models:/{name}/{version.version}"):
        out = mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp_path / uri.split(":")[0]), tracking_uri=tracking)
        assert (Path(out) / "weights.bin").read_bytes() == payload, uri
    keys = [o["Key"] for o in s3_client(platform).list_objects_v2(Bucket="mlflow")["Contents"]]
    assert any(key.endswith(f"{run.info.run_id}/artifacts/model/weights.bin") for key in keys), keys


def test_dev_up_with_redis_keeps_the_example_online_store_in_redis_on_loopback(tmp_path):
    """Backend: local platform of its own (`kubeloop dev up --online-store
    redis`): Debian's redis-server runs as a platform process listening on
    127.0.0.1 only, the example repository's feature_store.yaml names it,
    `kubeloop features materialize` fills it, and `dev down` stops it."""
    state_dir = tmp_path / "platform"
    cli = [sys.executable, "-m", "kubeloop.cli", "dev"]
    subprocess.run([*cli, "up", "--state-dir", str(state_dir), "--online-store", "redis"], check=True, timeout=300)
    platform = Platform(state_dir)
    try:
        state = platform.state()
        assert state.online_store == "redis"
        record = next(p for p in state.processes if p.name == "redis")
        listening = {c.laddr for c in psutil.Process(record.pid).net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN}
        assert {(a.ip, a.port) for a in listening} == {("127.0.0.1", state.ports["redis"])}
        repo = Path(platform.env()["KUBELOOP_FEAST_REPO"])
        config = yaml.safe_load((repo / "feature_store.yaml").read_text())
        assert config["online_store"] == {"type": "redis", "connection_string": f"127.0.0.1:{state.ports['redis']}"}
        subprocess.run([sys.executable, "-m", "kubeloop.cli", "features", "materialize", "--repo", str(repo)],
                       check=True, timeout=300)
        with redis.Redis(host="127.0.0.1", port=state.ports["redis"]) as client:
            assert client.dbsize() > 1000
        assert not (repo / "data" / "online.db").exists()
        # Asking the running platform for the other store is refused, naming the way out.
        refused = subprocess.run([*cli, "up", "--state-dir", str(state_dir)], capture_output=True, text=True,
                                 timeout=60)
        assert refused.returncode == 1 and "keeps online features in redis" in " ".join(refused.stderr.split())
    finally:
        subprocess.run([*cli, "down", "--state-dir", str(state_dir)], check=True, timeout=120)
    assert not psutil.pid_exists(record.pid) or psutil.Process(record.pid).status() == psutil.STATUS_ZOMBIE
