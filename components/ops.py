"""The KFP components of kubeloop's pipelines.

Each is a thin wrapper: it imports kubeloop inside (KFP runs the function's
source in the component's image) and calls the step function that the tests
exercise directly. All run in the kubeloop components image, which holds
kubeloop and kfp, so KFP does not pip-install anything at run time: the
default one here, or the operator's (set on each task by the pipeline
builders, kubeloop.pipelines.environment).

Every step takes the spec as JSON text (KubeModel.to_json), not a dict: KFP
carries a dict parameter as a protobuf Struct, whose numbers are all
doubles, so the int 96 of spec.model.parameters would reach the user's
factory as 96.0 on the local runner (and a whole float 1.0 as the int 1 in
the JSON KFP's Go driver writes on a cluster). A string arrives as it was sent.
"""

# No `from __future__ import annotations`: KFP reads the annotations as types.

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

from kubeloop.version import COMPONENTS_IMAGE


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def training_data(spec: str, feature_store: str, feast_repo: str, feature_store_file: str,
                  dataset: Output[Dataset]) -> str:
    """Labelled entity rows joined point-in-time with Feast features."""
    from kubeloop.components.steps import training_data_step

    return training_data_step(spec, feature_store, feast_repo, dataset.path, feature_store_file)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def validate_data(spec: str, dataset: Input[Dataset], dataset_info: str, tracking_uri: str, pipeline_run: str,
                  owner: str) -> str:
    """Check the rows against spec.validation and the champion's training
    data; fails the run on a violation (fail mode); returns the report."""
    from kubeloop.components.steps import validate_step

    return validate_step(spec, dataset.path, dataset_info, tracking_uri, pipeline_run, owner)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def train(spec: str, dataset: Input[Dataset], dataset_info: str, validation: str, tracking_uri: str,
          pipeline_run: str, owner: str, spec_hash: str, git_sha: str, model: Output[Model]) -> str:
    """Tune and train the torch model; returns the MLflow run id."""
    from kubeloop.components.steps import train_step

    return train_step(spec, dataset.path, dataset_info, model.path, tracking_uri, pipeline_run, owner,
                      spec_hash, git_sha, validation)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def train_on_trainer(spec: str, dataset: Input[Dataset], dataset_info: str, validation: str, tracking_uri: str,
                     pipeline_run: str, owner: str, spec_hash: str, git_sha: str, namespace: str, trainer: str,
                     model: Output[Model]) -> str:
    """Multi-node training as kubeloop's Kubeflow Trainer TrainJob on this
    step's data (trainer: its image, bucket and Secrets); returns the MLflow run id."""
    from kubeloop.components.steps import train_on_trainer_step

    return train_on_trainer_step(spec, dataset.path, dataset_info, validation, model.path, tracking_uri,
                                 pipeline_run, owner, spec_hash, git_sha, namespace, trainer)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def evaluate(spec: str, dataset: Input[Dataset], dataset_info: str, model: Input[Model], tracking_uri: str,
             run_id: str) -> str:
    """Hold-out and per-slice metrics."""
    from kubeloop.components.steps import evaluate_step

    return evaluate_step(spec, dataset.path, dataset_info, model.path, tracking_uri, run_id)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def register(spec: str, dataset_info: str, model: Input[Model], evaluation: str, tracking_uri: str,
             run_id: str, pipeline_run: str, owner: str, git_sha: str) -> dict:
    """Log the model with lineage and register a new version."""
    from kubeloop.components.steps import register_step

    return register_step(spec, dataset_info, model.path, evaluation, tracking_uri, run_id, pipeline_run,
                         owner, git_sha)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def optimization_data(spec: str, source_version: str, tracking_uri: str, feast_repo: str,
                      dataset: Output[Dataset], source: Output[Model]) -> str:
    """The source model, and its training data rebuilt from Feast."""
    from kubeloop.components.optimize import optimization_data_step

    return optimization_data_step(spec, source_version, tracking_uri, feast_repo, dataset.path, source.path)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def optimize(spec: str, dataset_info: str, dataset: Input[Dataset], source: Input[Model], tracking_uri: str,
             source_version: str, pipeline_run: str, owner: str, git_sha: str, variants: Output[Model]) -> str:
    """Build and measure every variant; choose the winner."""
    from kubeloop.components.optimize import optimize_step

    return optimize_step(spec, dataset_info, dataset.path, source.path, tracking_uri, source_version,
                         pipeline_run, owner, variants.path, git_sha)


@dsl.component(base_image=COMPONENTS_IMAGE, install_kfp_package=False)
def register_optimized(spec: str, source_version: str, results: str, variants: Input[Model], tracking_uri: str,
                       pipeline_run: str, owner: str) -> dict:
    """Register the winner with its Triton repositories and lineage."""
    from kubeloop.components.optimize import register_optimized_step

    return register_optimized_step(spec, source_version, results, variants.path, tracking_uri, pipeline_run, owner)
