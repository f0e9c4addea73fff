"""spec.model.parameters reach the team's factory with the types the
manifest gives them, along the path a step receives its spec on: the
operator's run request, the parameter type the pipeline's IR declares, the
executor input kfp builds from that type, and the step's own decoding.

The local backend's path is followed with kfp's own local-runner functions
(the executor input, the JSON of the step's command line, the executor that
calls the component) into the real train step. The cluster's path is proved
by its contract only: no KFP server runs here (its runs need ML Metadata's
C++ server), so these check the parameter type of the IR the kfp backend
submits and the text of the run's spec parameter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from kfp import dsl
from kfp.dsl.executor import Executor
from kfp.local import executor_input_utils
from mlflow import MlflowClient
from torch import nn

from kubeloop.api.optimization import OptimizedModelSpec
from kubeloop.api.refs import ObjectRef
from kubeloop.api.training import TrainingJobSpec
from kubeloop.components import ops, steps
from kubeloop.components.trainer_run import RUN_ENV, TrainerRun
from kubeloop.components.trainjob import TrainerSettings, build_run_trainjob, plan_run
from kubeloop.operator.builders.pipelines import build_optimization_run, build_training_run
from kubeloop.pipelines import optimization, training
from kubeloop.pipelines.backends.kfp import KfpBackend

MANIFEST = """
modelName: faults
task: binary
features:
  featureViews: [machine_telemetry]
  labels: {source: maintenance_events, column: fault}
model:
  factory: tests.components.test_model_parameters:build
  parameters:
    width: 96
    dropout: 0.25
    gain: 1.0              # a whole float: the JSON KFP's Go driver writes of a Struct has 1
    residual: true
    activation: gelu
    widths: [32, 16]
    head: {depth: 2, scale: 0.5}
hyperparameters: {epochs: 1, batchSize: 64}
"""
WRITTEN = yaml.safe_load(MANIFEST)
JOB = TrainingJobSpec.model_validate(WRITTEN)
OPTIMIZED = OptimizedModelSpec.model_validate({"source": {"name": "faults", "version": "1"}, "batchSizes": [1, 8]})
REF = ObjectRef("TrainingJob", "ml", "faults", "uid-1", generation=1)
COMPILED = {"training": training.COMPILED, "optimization": optimization.COMPILED}


def build(n_inputs: int, n_outputs: int, width: int, dropout: float, gain: float, residual: bool, activation: str,
          widths: list[int], head: dict) -> nn.Module:
    """A team's factory that takes its arguments as written: nn.Linear
    accepts only an int width (96.0 raises TypeError)."""
    return nn.Sequential(nn.Linear(n_inputs, width), nn.GELU(), nn.Dropout(dropout), nn.Linear(width, n_outputs))


def typed(value):  # noqa: ANN001, ANN201 - any JSON value
    """The value with each leaf's type beside it: 96 == 96.0, but
    ("int", 96) != ("float", 96.0)."""
    if isinstance(value, dict):
        return {k: typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    return type(value).__name__, value


def as_a_step_receives(pipeline, component, spec, root: Path):  # noqa: ANN001, ANN201 - kfp's components, a spec
    """The spec argument as the component's function gets it on the local
    backend: kfp's local runner builds the executor input from the type the
    pipeline's IR declares, passes it to the step as JSON on its command line,
    and kfp's executor hands the parameter to the function."""
    component_spec = pipeline.pipeline_spec.components[f"comp-{component.name}"]
    artifacts = {name: dsl.Artifact(name=name, uri=str(root / name), metadata={})
                 for name in component_spec.input_definitions.artifacts}
    executor_input = executor_input_utils.construct_executor_input(
        component_spec, {"spec": spec, **artifacts}, str(root), block_input_artifact=False)
    command_line = json.dumps(executor_input_utils.executor_input_to_dict(executor_input, component_spec))
    return Executor(json.loads(command_line), component).get_input_parameter_value("spec")


def test_the_factory_gets_the_manifests_types_through_the_local_backends_train_step(small_dataset, tracking,
                                                                                     tmp_path):
    request = build_training_run(REF, JOB, "abc")
    # The local backend hands the worker its arguments as request.json.
    arguments = json.loads(json.dumps(request.arguments))
    spec = as_a_step_receives(training.training_pipeline, ops.train, arguments["spec"], tmp_path / "root")
    path, info = small_dataset
    model_dir = tmp_path / "model"
    run_id = steps.train_step(spec, str(path), info.to_json(), str(model_dir), tracking, request.name, "ml/faults",
                              "abc", "deadbeef")
    # What the factory was called with is what the saved model rebuilds from.
    saved = torch.load(model_dir / "state.pt", map_location="cpu", weights_only=True)["architecture"]
    assert typed(saved["parameters"]) == typed(WRITTEN["model"]["parameters"])
    recorded = MlflowClient(tracking).get_run(run_id).data.tags["model.parameters"]
    assert recorded == json.dumps(WRITTEN["model"]["parameters"], sort_keys=True)


def spec_types(ir: dict) -> dict[str, str]:
    """The type the pipeline and each of its components declare for the spec."""
    return {name: definition["inputDefinitions"]["parameters"]["spec"]["parameterType"]
            for name, definition in [("root", ir["root"]), *ir["components"].items()]}


@pytest.mark.parametrize("run", [
    build_training_run(REF, JOB, "abc"),
    build_training_run(REF, TrainingJobSpec.model_validate({**WRITTEN, "distributed": {"nodes": 2}}), "abc"),
    build_optimization_run(REF, OPTIMIZED, "1", "abc"),
], ids=["training", "training-on-trainer", "optimization"])
def test_every_step_takes_the_spec_as_a_string_parameter(run, tmp_path):
    """A dict parameter would be a protobuf Struct, whose numbers are all
    doubles. The committed IR is what the local runner runs (a test pins it
    to the pipeline's code); the other is what the kfp backend submits."""
    committed = yaml.safe_load(COMPILED[run.pipeline].read_text())
    submitted = yaml.safe_load(KfpBackend("http://kfp.invalid", outcomes=dict).compile(
        run, tmp_path / "ir.yaml").read_text())
    for ir in (committed, submitted):
        assert set(spec_types(ir).values()) == {"STRING"}, spec_types(ir)


def test_the_cluster_runs_spec_decodes_to_the_manifests_types():
    """KFP hands a string parameter to the step as it was sent."""
    sent = KfpBackend("http://kfp.invalid", outcomes=dict).arguments(build_training_run(REF, JOB, "abc"))["spec"]
    assert typed(TrainingJobSpec.from_json(sent).model.parameters) == typed(WRITTEN["model"]["parameters"])


def test_the_trainjobs_nodes_get_the_manifests_types():
    """Multi-node training: the step hands the spec on to the TrainJob's
    Pods in the same encoding, and they decode it the same way."""
    settings = TrainerSettings(image="img:1", tracking_uri="http://mlflow:5000")
    run = plan_run(settings, "ml", "run", JOB.to_json(), "ml/fraud", "h", leave_model=True)
    trainjob = build_run_trainjob(run, JOB, settings, None, {}, [])
    sent = next(e["value"] for e in trainjob["spec"]["trainer"]["env"] if e["name"] == RUN_ENV)
    assert typed(TrainingJobSpec.from_json(TrainerRun.from_json(sent).spec).model.parameters) == typed(
        WRITTEN["model"]["parameters"])
