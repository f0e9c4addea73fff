"""The compiled pipeline IR: committed, reproducible, loadable by kfp."""

from __future__ import annotations

import yaml
from kfp import components

from kubeloop.api.training import TrainingResources
from kubeloop.pipelines.training import COMPILED, compile_training


def test_committed_ir_recompiles_identically(tmp_path):
    fresh = compile_training(tmp_path / "training.yaml")
    assert fresh.read_text() == COMPILED.read_text(), "run `make pipelines` and commit the result"


def test_committed_ir_loads_with_kfps_loader():
    pipeline = components.load_component_from_file(str(COMPILED))
    assert pipeline.name == "kubeloop-training"
    assert set(pipeline.component_spec.inputs) == {"spec", "feast_repo", "tracking_uri", "pipeline_run", "owner",
                                                   "spec_hash", "git_sha", "feature_store"}


def test_steps_run_in_the_components_image_without_pip():
    ir = yaml.safe_load(COMPILED.read_text())
    executors = ir["deploymentSpec"]["executors"]
    assert set(executors) == {"exec-training-data", "exec-train", "exec-evaluate", "exec-register"}
    for executor in executors.values():
        assert executor["container"]["image"].startswith("ghcr.io/kubeloop/components:")
        assert "pip install" not in " ".join(executor["container"]["command"])


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
