"""The Kubeflow Trainer TrainJob of a multi-node TrainingJob."""

from __future__ import annotations

import yaml

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.trainer_run import RUN_ENV, STORE_ENV, TrainerRun
from kubeloop.components.trainjob import (TRAINING_RUNTIME, TrainerSettings, build_run_trainjob, plan_run,
                                          trainjob_finished)
from kubeloop.pipelines.training import build_training_pipeline, compile_training  # noqa: F401


def spec(**fields) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({"modelName": "m", "features": {"featureViews": ["v"], "labels": {"source": "transactions", "column": "is_fraud"}}, **fields})


def trainjob(job: TrainingJobSpec, leave_model: bool = True) -> dict:
    """The TrainJob the kfp backend's multi-node step creates (leave_model) or the trainer backend's."""
    settings = TrainerSettings(image="img:1", tracking_uri="http://mlflow:5000", object_store_secret="store",
                               object_store_endpoint="http://10.0.0.1:8333")
    run = plan_run(settings, "ml", "run-1", job.to_json(), "ml/m", "h", leave_model=leave_model)
    return build_run_trainjob(run, job, settings, None, {}, [])


def test_nodes_processes_and_gpus_map_onto_the_trainjob():
    job = trainjob(spec(distributed={"nodes": 4, "processesPerNode": 8},
                        resources={"cpu": "16", "memory": "64Gi", "gpu": {"count": 8, "product": "NVIDIA-H100-80GB-HBM3"}}))
    trainer = job["spec"]["trainer"]
    assert job["spec"]["runtimeRef"] == {"name": TRAINING_RUNTIME}
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 8)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    # torchrun reads the sizes Trainer's torch runtime sets (PET_*) and meets at its first node's address
    assert trainer["command"][0] == "torchrun" and trainer["command"][-3:] == [
        "--module", "kubeloop.components.distributed", "--trainer-run"]
    assert "--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)" in trainer["command"]
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = pod["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_a_pipeline_that_prepared_its_data_gets_the_model_left_for_its_own_steps():
    """The kfp step's TrainJob: no store for the initializer (it keeps the
    data the pipeline put below the run's prefix), and rank 0 leaves the
    model below it instead of registering; the trainer backend's registers."""
    left = TrainerRun.from_json(env_of(trainjob(spec(distributed={"nodes": 2})))[RUN_ENV]["value"])
    assert left.output == f"{left.prefix}/model" and left.prefix == "s3://training/ml/run-1"
    assert TrainerRun.from_json(env_of(trainjob(spec(), leave_model=False))[RUN_ENV]["value"]).output == ""
    initializer = trainjob(spec(distributed={"nodes": 2}))["spec"]["initializer"]["dataset"]
    assert initializer["storageUri"] == left.data and STORE_ENV not in {e["name"] for e in initializer["env"]}


def test_object_storage_reaches_the_nodes_with_credentials_by_reference():
    env = env_of(trainjob(spec(distributed={"nodes": 2})))
    assert env["AWS_ENDPOINT_URL_S3"]["value"] == "http://10.0.0.1:8333"
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {
        "secretKeyRef": {"name": "store", "key": "AWS_SECRET_ACCESS_KEY"}}}


def test_each_node_pod_joins_the_rendezvous_as_itself():
    """A Pod started again keeps its predecessor's hostname and pid 1; its own IP tells them apart."""
    env = env_of(trainjob(spec(distributed={"nodes": 2})))
    assert env["PET_LOCAL_ADDR"] == {"name": "PET_LOCAL_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def test_cpu_trainjob_has_no_gpu_patch():
    job = trainjob(spec(distributed={"nodes": 2}))
    assert "runtimePatches" not in job["spec"]
    assert "nvidia.com/gpu" not in job["spec"]["trainer"]["resourcesPerNode"]["limits"]


def env_of(job: dict) -> dict[str, dict]:
    return {e["name"]: e for e in job["spec"]["trainer"]["env"]}


def test_completion_and_failure_are_read_from_conditions():
    assert trainjob_finished({}) == (False, None)
    assert trainjob_finished({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}) == (True, None)
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "message": "OOMKilled"}]}}
    assert trainjob_finished(failed) == (True, "OOMKilled")


def test_multi_node_pipeline_trains_in_a_trainjob(tmp_path):
    from kfp import compiler

    path = tmp_path / "p.yaml"
    s = spec(distributed={"nodes": 2})
    compiler.Compiler().compile(build_training_pipeline(s.resources, s.distributed, "ml"), str(path))
    executors = yaml.safe_load(path.read_text())["deploymentSpec"]["executors"]
    assert "exec-train-on-trainer" in executors and "exec-train" not in executors
