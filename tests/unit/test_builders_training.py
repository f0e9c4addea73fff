"""The Kubeflow Trainer TrainJob of a multi-node TrainingJob."""

from __future__ import annotations

import yaml

from kubeloop.api.training import TrainingJobSpec
from kubeloop.components.trainjob import build_trainjob, trainjob_finished
from kubeloop.pipelines.training import build_training_pipeline, compile_training  # noqa: F401


def spec(**fields) -> TrainingJobSpec:
    return TrainingJobSpec.model_validate({"modelName": "m", "features": {"featureViews": ["v"], "labels": {"source": "transactions", "column": "is_fraud"}}, **fields})


def test_nodes_processes_and_gpus_map_onto_the_trainjob():
    job = build_trainjob("run-train", "ml", spec(distributed={"nodes": 4, "processesPerNode": 8},
                                                 resources={"cpu": "16", "memory": "64Gi",
                                                            "gpu": {"count": 8, "product": "NVIDIA-H100-80GB-HBM3"}}),
                         "img:1", "gs://b/data", "{}", "gs://b/model")
    trainer = job["spec"]["trainer"]
    assert job["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (4, 8)
    assert trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == "8"
    # torchrun reads the sizes Trainer's torch runtime sets (PET_*) and meets at its first node's address
    assert trainer["command"][0] == "torchrun" and trainer["command"][-2:] == ["--module", "kubeloop.components.distributed"]
    assert "--rdzv-endpoint=$(PET_MASTER_ADDR):$(PET_MASTER_PORT)" in trainer["command"]
    pod = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = pod["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_object_storage_reaches_the_nodes_with_credentials_by_reference():
    job = build_trainjob("r", "ml", spec(distributed={"nodes": 2}), "img:1", "s3://b/d", "{}", "s3://b/o",
                         store_secret="store", store_endpoint="http://10.0.0.1:8333")
    env = {e["name"]: e for e in job["spec"]["trainer"]["env"]}
    assert env["AWS_ENDPOINT_URL_S3"]["value"] == "http://10.0.0.1:8333"
    assert env["AWS_SECRET_ACCESS_KEY"] == {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {
        "secretKeyRef": {"name": "store", "key": "AWS_SECRET_ACCESS_KEY"}}}
    assert [e["name"] for e in build_trainjob("r", "ml", spec(), "img:1", "d", "{}", "o")["spec"]["trainer"]["env"]] \
        == ["PET_LOCAL_ADDR"]  # no store: no store variables


def test_each_node_pod_joins_the_rendezvous_as_itself():
    """A replacement Pod keeps its predecessor's hostname and pid 1; its own IP tells them apart."""
    env = build_trainjob("r", "ml", spec(distributed={"nodes": 2}), "img:1", "d", "{}", "o")["spec"]["trainer"]["env"]
    assert {"name": "PET_LOCAL_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in env


def test_cpu_trainjob_has_no_gpu_patch():
    job = build_trainjob("r", "ml", spec(distributed={"nodes": 2}), "img:1", "d", "{}", "o")
    assert "runtimePatches" not in job["spec"]
    assert "nvidia.com/gpu" not in job["spec"]["trainer"]["resourcesPerNode"]["limits"]


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
