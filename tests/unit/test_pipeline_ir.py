"""The compiled pipeline IR: committed, reproducible, loadable by kfp; and
the IR the kfp backend would submit with the operator's step environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kfp import components

from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.api.training import TrainingJobSpec, TrainingResources
from kubeloop.pipelines.backends.base import RunRequest
from kubeloop.pipelines.backends.kfp import KfpBackend
from kubeloop.pipelines.environment import FEATURE_STORE_MOUNT, MLFLOW_KEYS, OBJECT_STORE_KEYS, StepEnvironment
from kubeloop.pipelines.optimization import COMPILED as OPTIMIZATION_COMPILED, compile_optimization
from kubeloop.pipelines.training import COMPILED, compile_training
from kubeloop.version import COMPONENTS_IMAGE


@pytest.mark.parametrize("compiled, compile_", [(COMPILED, compile_training),
                                                (OPTIMIZATION_COMPILED, compile_optimization)],
                         ids=["training", "optimization"])
def test_committed_ir_recompiles_identically(tmp_path, compiled, compile_):
    fresh = compile_(tmp_path / compiled.name)
    assert fresh.read_text() == compiled.read_text(), "run `make pipelines` and commit the result"


def test_committed_ir_loads_with_kfps_loader():
    pipeline = components.load_component_from_file(str(COMPILED))
    assert pipeline.name == "kubeloop-training"
    assert set(pipeline.component_spec.inputs) == {"spec", "feast_repo", "tracking_uri", "pipeline_run", "owner",
                                                   "spec_hash", "git_sha", "feature_store"}


def test_steps_run_in_the_components_image_without_pip():
    ir = yaml.safe_load(COMPILED.read_text())
    executors = ir["deploymentSpec"]["executors"]
    assert set(executors) == {"exec-training-data", "exec-validate-data", "exec-train", "exec-evaluate",
                              "exec-register"}
    for executor in executors.values():
        assert executor["container"]["image"] == COMPONENTS_IMAGE
        assert "pip install" not in " ".join(executor["container"]["command"])
    # The committed IR carries no credentials and no mounts: one document, no platform settings.
    assert len(list(yaml.safe_load_all(COMPILED.read_text()))) == 1


def test_gpu_requests_become_accelerator_node_selector_and_toleration(tmp_path):
    resources = TrainingResources.model_validate({"cpu": "4", "memory": "16Gi",
                                                  "gpu": {"count": 2, "product": "NVIDIA-A100-SXM4-40GB"}})
    ir_path = compile_training(tmp_path / "gpu.yaml", resources)
    docs = list(yaml.safe_load_all(ir_path.read_text()))
    train = docs[0]["deploymentSpec"]["executors"]["exec-train"]["container"]["resources"]
    assert train["accelerator"]["resourceType"] == "nvidia.com/gpu" and train["accelerator"]["resourceCount"] == "2"
    assert train["cpuRequest"] == 4 and train["memoryLimit"] == 16 * 1024**3 / 1e9
    platform = docs[1]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-train"]
    assert platform["nodeSelector"]["labels"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
    assert platform["tolerations"] == [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]


# The IR the kfp backend submits on a cluster. These prove the cluster (KFP)
# path's contract only: no KFP server runs here (its runs need ML Metadata's
# C++ server), so no step of this IR is executed by these tests.
CLUSTER_STEPS = StepEnvironment(image="registry.example/kubeloop/components:1a2b3c",
                                mlflow_secret="mlflow-credentials", object_store_secret="artifact-store",
                                object_store_endpoint="http://minio.minio.svc:9000")
# What a feature_store.yaml may hold, and the IR must never carry.
STORE_CREDENTIAL = "hunter2"
MLFLOW_STEPS = {"exec-validate-data", "exec-train", "exec-evaluate", "exec-register"}
OPTIMIZED = OptimizedModelSpec.model_validate({"source": {"name": "fraud", "version": "1"}}).to_json()


def _job(**extra) -> str:
    return TrainingJobSpec.model_validate({
        "modelName": "fraud", "features": {"featureViews": ["card_activity"],
                                           "labels": {"source": "transactions", "column": "is_fraud"},
                                           "store": {"configMap": {"name": "feast-client"}}}, **extra}).to_json()


def _cluster_ir(tmp_path: Path, pipeline: str, spec: str, **arguments) -> tuple[str, dict, dict]:
    """The submitted IR's text, the pipeline spec and its executors' Kubernetes settings."""
    backend = KfpBackend("http://kfp.invalid", outcomes=dict, steps=CLUSTER_STEPS, git_sha="1a2b3c")
    request = RunRequest(name="ml-fraud-g1-abc", pipeline=pipeline,
                         arguments={"spec": spec, "owner": "ml/fraud", "spec_hash": "abc", **arguments})
    text = backend.compile(request, tmp_path / f"{pipeline}.yaml").read_text()
    ir, *platform = yaml.safe_load_all(text)
    kubernetes = platform[0]["platforms"]["kubernetes"]["deploymentSpec"]["executors"] if platform else {}
    return text, ir, kubernetes


def _executors(ir: dict) -> dict:
    return ir["deploymentSpec"]["executors"]


def _task_input(ir: dict, task: str, name: str) -> dict:
    return ir["root"]["dag"]["tasks"][task]["inputs"]["parameters"][name]


def _secrets(config: dict) -> dict[str, tuple[bool, list[str]]]:
    """Each Secret's variables, and whether its keys are optional."""
    return {s["secretName"]: (s["optional"], [k["envVar"] for k in s["keyToEnv"]])
            for s in config.get("secretAsEnv", [])}


def test_cluster_ir_runs_every_step_in_the_operators_components_image(tmp_path):
    _, training, _ = _cluster_ir(tmp_path, "training", _job())
    _, multi_node, _ = _cluster_ir(tmp_path, "training", _job(distributed={"nodes": 2}))
    _, optimization, _ = _cluster_ir(tmp_path, "optimization", OPTIMIZED, source_version="3")
    for ir in (training, multi_node, optimization):
        assert {e["container"]["image"] for e in _executors(ir).values()} == {CLUSTER_STEPS.image}
    assert set(_executors(optimization)) == {"exec-optimization-data", "exec-optimize", "exec-register-optimized"}
    # The TrainJob's Pods run the same image and Secrets, by name: the step is told them as a constant input.
    trainer = json.loads(_task_input(multi_node, "train-on-trainer", "trainer")["runtimeValue"]["constant"])
    assert trainer == {"image": CLUSTER_STEPS.image, "bucket": "training", "mlflow_secret": "mlflow-credentials",
                       "object_store_secret": "artifact-store", "object_store_endpoint": "http://minio.minio.svc:9000"}
    # The TrainJob's rank 0 leaves the model: the pipeline evaluates and registers it as on one node.
    assert {"exec-train-on-trainer", "exec-evaluate", "exec-register"} <= set(_executors(multi_node))


def test_cluster_ir_mounts_the_feature_store_configmap_into_the_data_step_only(tmp_path):
    text, ir, kubernetes = _cluster_ir(tmp_path, "training", _job(),
                                      feature_store=f'{{"config": "password: {STORE_CREDENTIAL}"}}')
    mounts = {name: config.get("configMapAsVolume") for name, config in kubernetes.items()}
    assert mounts.pop("exec-training-data") == [{
        "configMapName": "feast-client", "mountPath": FEATURE_STORE_MOUNT, "optional": False,
        "configMapNameParameter": {"runtimeValue": {"constant": "feast-client"}}}]
    assert not any(mounts.values())
    given = _task_input(ir, "training-data", "feature_store_file")
    assert given == {"runtimeValue": {"constant": f"{FEATURE_STORE_MOUNT}/feature_store.yaml"}}
    assert STORE_CREDENTIAL not in text


def test_cluster_ir_gives_credentials_by_secret_reference_to_the_steps_that_talk_to_mlflow(tmp_path):
    text, ir, kubernetes = _cluster_ir(tmp_path, "training", _job())
    _, opt_ir, opt_kubernetes = _cluster_ir(tmp_path, "optimization", OPTIMIZED, source_version="3")
    executors, opt_executors = _executors(ir), _executors(opt_ir)
    # MLflow's Secret holds a username and password or a token: its keys are optional.
    wanted = {"mlflow-credentials": (True, list(MLFLOW_KEYS)), "artifact-store": (False, list(OBJECT_STORE_KEYS))}
    assert {name for name, config in kubernetes.items() if _secrets(config) == wanted} == MLFLOW_STEPS
    assert not _secrets(kubernetes["exec-training-data"])
    assert all(_secrets(opt_kubernetes[name]) == wanted for name in opt_executors)
    endpoint = [{"name": "MLFLOW_S3_ENDPOINT_URL", "value": CLUSTER_STEPS.object_store_endpoint}]
    assert {name for name, e in executors.items() if e["container"].get("env") == endpoint} == MLFLOW_STEPS
    # By reference only: no credential variable is ever given a value in the IR.
    env = [v["name"] for e in (*executors.values(), *opt_executors.values()) for v in e["container"].get("env", [])]
    assert not set(env) & {*MLFLOW_KEYS, *OBJECT_STORE_KEYS}
    assert "secretKeyRef" not in text and "value: " + STORE_CREDENTIAL not in text


def test_a_step_reads_the_mounted_feature_store_yaml_as_the_stores_text(tmp_path):
    """The location the step records for serving and optimisation is the file's
    text, not a path that exists only in the step's Pod."""
    from kubeloop.featurestore.store import StoreLocation

    mounted = tmp_path / "feature_store.yaml"
    mounted.write_text("project: fraud\n")
    assert StoreLocation.resolve("", "/repo", str(mounted)) == StoreLocation(config="project: fraud\n")
    assert StoreLocation.resolve("", "/repo") == StoreLocation(path="/repo")
