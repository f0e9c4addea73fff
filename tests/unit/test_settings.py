"""The operator's configuration from its environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kubeloop.operator.settings import TRITON_BACKENDS, ConfigurationError, OperatorConfig


def test_an_empty_or_wrong_number_names_the_variable():
    """Local and cluster: the chart and `kubeloop dev env` both set these."""
    with pytest.raises(ConfigurationError, match="KUBELOOP_WEBHOOK_PORT=''"):
        OperatorConfig.from_env({"KUBELOOP_WEBHOOK_PORT": ""})
    with pytest.raises(ConfigurationError, match="KUBELOOP_RESYNC_SECONDS='soon'"):
        OperatorConfig.from_env({"KUBELOOP_RESYNC_SECONDS": "soon"})
    with pytest.raises(ConfigurationError, match="KUBELOOP_WEBHOOK_TOKEN_FILE"):
        OperatorConfig.from_env({"KUBELOOP_WEBHOOK_PORT": "8080"})
    with pytest.raises(ConfigurationError, match="KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE"):
        OperatorConfig.from_env({"KUBELOOP_MLFLOW_WEBHOOK_URL": "http://127.0.0.1:1/hooks/mlflow"})


def test_every_bad_variable_is_named_at_once_with_what_to_set_it_to():
    """Local and cluster: a Deployment with three mistakes is fixed in one round, not three."""
    with pytest.raises(ConfigurationError) as caught:
        OperatorConfig.from_env({"KUBELOOP_WEBHOOK_PORT": "70000", "KUBELOOP_TENSORRT": "maybe",
                                 "KUBELOOP_GPU_ALLOCATION": "mig", "KUBELOOP_NAMESPACES": "a, b"})
    problems = str(caught.value).split("; ")
    assert [p.split("=", 1)[0] for p in problems] == [
        "KUBELOOP_GPU_ALLOCATION", "KUBELOOP_TENSORRT", "KUBELOOP_WEBHOOK_PORT"]
    assert "KUBELOOP_GPU_ALLOCATION='mig': set it to device-plugin or dra" in problems[0]
    assert "less than or equal to 65535" in problems[2]
    config = OperatorConfig.from_env({"KUBELOOP_NAMESPACES": "a, b", "KUBELOOP_TENSORRT": "true"})
    assert (config.namespaces, config.tensorrt) == (["a", "b"], True)


def test_the_triton_backend_is_one_kubeloop_lays_out():
    """Cluster path (settings): the chart's serving.tritonBackend reaches the
    serving backend; a backend no repository is laid out for is refused by name."""
    from kubeloop.components.triton import BACKENDS
    from kubeloop.operator.wiring import build_serving_backends

    assert set(TRITON_BACKENDS) == set(BACKENDS)
    assert OperatorConfig.from_env({}).triton_backend == "onnxruntime"
    config = OperatorConfig.from_env({"KUBELOOP_TRITON_BACKEND": "python"})
    assert build_serving_backends(config, kube=None)["kubernetes"].images.triton_backend == "python"
    with pytest.raises(ConfigurationError, match="KUBELOOP_TRITON_BACKEND='tensorrt'.*onnxruntime or python"):
        OperatorConfig.from_env({"KUBELOOP_TRITON_BACKEND": "tensorrt"})


def test_the_operator_says_so_in_one_line_without_a_traceback(tmp_path):
    """Local: `kubeloop operator` with KUBELOOP_WEBHOOK_PORT= exits 2 with one line."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBELOOP_WEBHOOK_PORT": ""}
    result = subprocess.run([sys.executable, "-m", "kubeloop.cli", "operator"], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "KUBELOOP_WEBHOOK_PORT" in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_the_default_work_dir_belongs_to_the_platform_not_to_everyone(tmp_path):
    """Local: two platforms on one machine never share runs through /tmp/kubeloop."""
    config = OperatorConfig.from_env({"KUBELOOP_STATE_DIR": str(tmp_path / "platform")})
    assert config.state_dir == tmp_path / "platform" / "operator"
    other = OperatorConfig.from_env({"XDG_STATE_HOME": str(tmp_path / "xdg")})
    assert other.state_dir == tmp_path / "xdg" / "kubeloop" / "dev" / "operator"
    assert OperatorConfig.from_env({"KUBELOOP_WORK_DIR": "/var/lib/kubeloop"}).state_dir == Path("/var/lib/kubeloop")
    assert not str(OperatorConfig.from_env({}).state_dir).startswith("/tmp/kubeloop")


def test_the_kfp_backend_gets_the_pipeline_steps_image_secrets_and_git_sha():
    """Cluster path (settings): the chart's pipelines.componentsImage,
    mlflow.credentialsSecret and objectStore values reach every submitted
    pipeline through the kfp backend's step environment."""
    from kubeloop.operator.wiring import build_pipeline_backends
    from kubeloop.pipelines.environment import StepEnvironment
    from kubeloop.version import git_sha

    env = {"KUBELOOP_PIPELINE_BACKENDS": "kfp", "KUBELOOP_KFP_ENDPOINT": "http://ml-pipeline.kubeflow:8888",
           "MLFLOW_TRACKING_URI": "http://mlflow.mlflow:5000", "KUBELOOP_COMPONENTS_IMAGE": "registry.example/c:1",
           "KUBELOOP_MLFLOW_SECRET": "mlflow-credentials", "KUBELOOP_OBJECT_STORE_SECRET": "artifact-store",
           "KUBELOOP_OBJECT_STORE_ENDPOINT": "http://minio.minio:9000"}
    backend = build_pipeline_backends(OperatorConfig.from_env(env))["kfp"]
    assert backend.steps == StepEnvironment(image="registry.example/c:1", mlflow_secret="mlflow-credentials",
                                            object_store_secret="artifact-store",
                                            object_store_endpoint="http://minio.minio:9000")
    assert backend.git_sha == git_sha()
    unset = build_pipeline_backends(OperatorConfig.from_env({k: v for k, v in env.items() if "SECRET" not in k}))
    assert unset["kfp"].steps.mlflow_secret is None and unset["kfp"].steps.object_store_secret is None


def test_the_cluster_runs_drift_checks_as_jobs_and_puts_the_front_in_front():
    """Cluster path (settings): the chart's KUBELOOP_DRIFT_MONITOR=kubernetes
    gives Job-based drift checks on the components image with the cluster's
    MLflow; KUBELOOP_ROUTER_IMAGE and an s3:// KUBELOOP_REQUEST_LOG reach the
    kubernetes serving backend; a monitor kubeloop does not have is refused."""
    from kubeloop.monitoring.kubernetes import DriftJobSettings, KubernetesDriftMonitor
    from kubeloop.monitoring.local import LocalDriftMonitor
    from kubeloop.operator.wiring import build_monitor, build_serving_backends

    env = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "KUBELOOP_CLUSTER_TRACKING_URI": "http://mlflow:5000",
           "KUBELOOP_COMPONENTS_IMAGE": "registry.example/runtime:1", "KUBELOOP_OBJECT_STORE_SECRET": "logs-s3",
           "KUBELOOP_ROUTER_IMAGE": "registry.example/runtime:1", "KUBELOOP_REQUEST_LOG": "s3://requests"}
    monitor = build_monitor(OperatorConfig.from_env({**env, "KUBELOOP_DRIFT_MONITOR": "kubernetes"}), kube=None)
    assert isinstance(monitor, KubernetesDriftMonitor)
    assert monitor.settings == DriftJobSettings(image="registry.example/runtime:1", tracking_uri="http://mlflow:5000",
                                                object_store_secret="logs-s3")
    assert isinstance(build_monitor(OperatorConfig.from_env(env), kube=None), LocalDriftMonitor)
    images = build_serving_backends(OperatorConfig.from_env(env), kube=None)["kubernetes"].images
    assert (images.router, images.request_log, images.object_store_secret) == (
        "registry.example/runtime:1", "s3://requests", "logs-s3")
    with pytest.raises(ConfigurationError, match="KUBELOOP_DRIFT_MONITOR='cronjob'.*local or kubernetes"):
        OperatorConfig.from_env({"KUBELOOP_DRIFT_MONITOR": "cronjob"})


def test_the_local_backends_start_their_processes_warm_unless_told_not_to(tmp_path):
    """Local path (settings): the local pipeline backend and the local
    monitors fork from the platform's server (KUBELOOP_STATE_DIR), else the
    work dir's; KUBELOOP_FORKSERVER=false gives them plain interpreters."""
    from kubeloop.operator.wiring import build_monitor, build_pipeline_backends

    env = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5000", "KUBELOOP_WORK_DIR": str(tmp_path / "work")}
    assert build_pipeline_backends(OperatorConfig.from_env(env))["local"].forkserver == tmp_path / "work"
    platform = OperatorConfig.from_env({**env, "KUBELOOP_STATE_DIR": str(tmp_path / "platform")})
    assert build_pipeline_backends(platform)["local"].forkserver == tmp_path / "platform"
    assert build_monitor(platform, kube=None).forkserver == tmp_path / "platform"
    off = OperatorConfig.from_env({**env, "KUBELOOP_FORKSERVER": "false"})
    assert build_pipeline_backends(off)["local"].forkserver is None
    assert build_monitor(off, kube=None).forkserver is None


def test_the_operators_own_jobs_ask_for_what_the_setting_gives_each_purpose():
    """Cluster path (settings and builders): KUBELOOP_JOB_RESOURCES sizes the
    Pods of drift checks and of materialisations, each purpose replacing its
    defaults whole and the other keeping them; a bad quantity, an unknown
    purpose and text that is not JSON are named with where they are."""
    from kubeloop.api.jobs import JobResources
    from kubeloop.api.refs import ObjectRef
    from kubeloop.featurestore.freshness import StoreNeed
    from kubeloop.monitoring.kubernetes import build_drift_job
    from kubeloop.operator.materializing import build_materialize_job
    from kubeloop.operator.wiring import build_materializer, build_monitor

    env = {"MLFLOW_TRACKING_URI": "http://mlflow:5000", "KUBELOOP_DRIFT_MONITOR": "kubernetes",
           "KUBELOOP_MATERIALIZER": "kubernetes",
           "KUBELOOP_OPERATOR_NAMESPACE": "kubeloop", "KUBELOOP_ROUTER_IMAGE": "registry.example/runtime:1",
           "KUBELOOP_JOB_RESOURCES": '{"monitoring": {"requests": {"cpu": "100m", "memory": "768Mi"}, '
                                     '"limits": {"cpu": 2}}}'}
    config = OperatorConfig.from_env(env)
    ref = ObjectRef("InferenceService", "ml", "fraud", uid="uid-9")
    drift = build_drift_job(ref, {"service": "ml/fraud"}, build_monitor(config, kube=None).settings, started=0)
    assert drift["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "100m", "memory": "768Mi"}, "limits": {"cpu": 2}}  # a number stays one, as Kubernetes takes it
    materializer = build_materializer(config, {"kubernetes": SimpleNamespace(reads_online_features=True)}, kube=None)
    try:
        job = build_materialize_job(StoreNeed(store="project: p", views=("v",), interval=60.0), 60.0, materializer._run.settings)
    finally:
        materializer.stop()
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"] == JobResources().materialize.container() == {
        "requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
    for value, named in [('{"monitoring": {"requests": {"cpu": "lots"}}}', r"monitoring\.requests\.cpu='lots'"),
                         ('{"drift": {}}', "drift={}: extra inputs are not permitted"),
                         ("500m", "='500m': not JSON")]:
        with pytest.raises(ConfigurationError, match=f"KUBELOOP_JOB_RESOURCES.*{named}"):
            OperatorConfig.from_env({"KUBELOOP_JOB_RESOURCES": value})
