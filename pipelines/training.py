"""The training pipeline: Feast training data -> data validation -> torch
training (with tuning) -> hold-out evaluation -> MLflow registration.

`training_pipeline` is the portable definition; its compiled IR is
committed as pipelines/compiled/training.yaml for the Kubeflow Pipelines UI.
`build_training_pipeline` returns the same pipeline with one job's compute
(CPU, memory, GPUs and the GPU product's node selector and toleration) set on
the training step, the operator's step environment (image, credentials) on
every step and the job's feature store ConfigMap mounted into the data step,
as the kfp backend submits it; a job on several nodes trains in a Kubeflow
Trainer TrainJob instead.
"""

# No `from __future__ import annotations`: KFP reads the annotations as types.

from pathlib import Path
from typing import Callable

from kfp import compiler, dsl, kubernetes

from kubeloop.api.training import ConfigMapKey, DistributedTraining, TrainingResources
from kubeloop.components import ops
from kubeloop.pipelines.environment import DEFAULT_STEPS, StepEnvironment, feature_store_file, mount_feature_store

COMPILED = Path(__file__).resolve().with_name("compiled") / "training.yaml"
NAME = "kubeloop-training"
DESCRIPTION = "Train a model on Feast features, evaluate it on a time hold-out and register it in MLflow."


def build_training_pipeline(resources: TrainingResources | None = None,
                            distributed: DistributedTraining | None = None, namespace: str = "kubeflow",
                            steps: StepEnvironment = DEFAULT_STEPS,
                            store: ConfigMapKey | None = None) -> Callable:
    """store: the job's feature store ConfigMap, mounted into the data step
    (the only step that reads Feast); the others talk to MLflow and get the
    credentials."""
    multi_node = distributed is not None and distributed.nodes > 1

    @dsl.pipeline(name=NAME, description=DESCRIPTION)
    def training_pipeline(spec: str, feast_repo: str, tracking_uri: str, pipeline_run: str, owner: str,
                          spec_hash: str, git_sha: str = "unknown", feature_store: str = "") -> dict:
        data = ops.training_data(spec=spec, feature_store=feature_store, feast_repo=feast_repo,
                                 feature_store_file=feature_store_file(store)).set_display_name("training data")
        steps.apply(mount_feature_store(data, store), credentials=False)
        validated = ops.validate_data(spec=spec, dataset=data.outputs["dataset"], dataset_info=data.outputs["Output"],
                                      tracking_uri=tracking_uri, pipeline_run=pipeline_run,
                                      owner=owner).set_display_name("validate data")
        common = dict(spec=spec, dataset=data.outputs["dataset"], dataset_info=data.outputs["Output"],
                      validation=validated.output, tracking_uri=tracking_uri, pipeline_run=pipeline_run, owner=owner,
                      spec_hash=spec_hash, git_sha=git_sha)
        if multi_node:
            trained = ops.train_on_trainer(**common, namespace=namespace,
                                           trainer=steps.trainer_settings()).set_display_name("train (TrainJob)")
        else:
            trained = ops.train(**common).set_display_name("train")
            if resources is not None:
                _set_compute(trained, resources)
        evaluated = ops.evaluate(spec=spec, dataset=data.outputs["dataset"], dataset_info=data.outputs["Output"],
                                 model=trained.outputs["model"], tracking_uri=tracking_uri,
                                 run_id=trained.outputs["Output"]).set_display_name("evaluate")
        registered = ops.register(spec=spec, dataset_info=data.outputs["Output"], model=trained.outputs["model"],
                                  evaluation=evaluated.output, tracking_uri=tracking_uri,
                                  run_id=trained.outputs["Output"], pipeline_run=pipeline_run, owner=owner,
                                  git_sha=git_sha).set_display_name("register")
        for task in (validated, trained, evaluated, registered):
            steps.apply(task, credentials=True)
        return registered.output

    return training_pipeline


def _set_compute(task: dsl.PipelineTask, resources: TrainingResources) -> None:
    task.set_cpu_request(str(resources.cpu)).set_memory_request(str(resources.memory))
    task.set_memory_limit(str(resources.memory))
    gpu = resources.gpu
    if gpu and gpu.count > 0:
        task.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(gpu.count)
        kubernetes.add_toleration(task, key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
        if gpu.product:
            kubernetes.add_node_selector(task, label_key="nvidia.com/gpu.product", label_value=gpu.product)


training_pipeline = build_training_pipeline()


def compile_training(path: Path = COMPILED, resources: TrainingResources | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_training_pipeline(resources), str(path))
    return path
