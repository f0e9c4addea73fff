"""The optimisation pipeline: source model and data -> every variant built
and measured -> the winner registered with its Triton repositories.

`optimization_pipeline` is compiled to pipelines/compiled/optimization.yaml;
`build_optimization_pipeline` puts the measuring step on a GPU for GPU targets
and the operator's step environment (image, credentials) on every step: each
talks to MLflow. The source's feature store is the one its version recorded.
"""

# No `from __future__ import annotations`: KFP reads the annotations as types.

from pathlib import Path
from typing import Callable

from kfp import compiler, dsl, kubernetes

from kubeloop.api.optimization import OptimizationTarget
from kubeloop.components import ops
from kubeloop.pipelines.environment import DEFAULT_STEPS, StepEnvironment

COMPILED = Path(__file__).resolve().with_name("compiled") / "optimization.yaml"
NAME = "kubeloop-optimization"
DESCRIPTION = ("Build quantised, pruned, distilled and compiled variants of a registered model, measure each, "
               "and register the fastest within the accuracy budget.")


def build_optimization_pipeline(target: OptimizationTarget | None = None,
                                steps: StepEnvironment = DEFAULT_STEPS) -> Callable:
    @dsl.pipeline(name=NAME, description=DESCRIPTION)
    def optimization_pipeline(spec: str, source_version: str, feast_repo: str, tracking_uri: str,
                              pipeline_run: str, owner: str, spec_hash: str, git_sha: str = "unknown") -> dict:
        data = ops.optimization_data(spec=spec, source_version=source_version, tracking_uri=tracking_uri,
                                     feast_repo=feast_repo).set_display_name("source and data")
        measured = ops.optimize(spec=spec, dataset_info=data.outputs["Output"], dataset=data.outputs["dataset"],
                                source=data.outputs["source"], tracking_uri=tracking_uri,
                                source_version=source_version, pipeline_run=pipeline_run, owner=owner,
                                git_sha=git_sha).set_display_name("build and measure variants")
        if target is not None and target.device == "gpu":
            measured.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(1)
            kubernetes.add_toleration(measured, key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")
            if target.gpu_product:
                kubernetes.add_node_selector(measured, label_key="nvidia.com/gpu.product",
                                             label_value=target.gpu_product)
        registered = ops.register_optimized(spec=spec, source_version=source_version, results=measured.outputs["Output"],
                                            variants=measured.outputs["variants"], tracking_uri=tracking_uri,
                                            pipeline_run=pipeline_run, owner=owner).set_display_name("register")
        for task in (data, measured, registered):
            steps.apply(task, credentials=True)
        return registered.output

    return optimization_pipeline


optimization_pipeline = build_optimization_pipeline()


def compile_optimization(path: Path = COMPILED, target: OptimizationTarget | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(build_optimization_pipeline(target), str(path))
    return path
