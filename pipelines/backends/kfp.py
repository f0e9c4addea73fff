"""The Kubeflow Pipelines backend: compiled IR submitted with kfp.Client.

The run's display name is the request name, so a restarted operator finds
the run it submitted before instead of submitting it again. A KFP run's
parameter outputs live in its metadata store, out of reach of the REST API;
what the pipeline registered is read from the model registry instead, where
the register step tags each version with the pipeline run's name.

The submitted pipeline runs every step in the operator's components image
with MLflow's and the object store's credentials as Secret references
(StepEnvironment), and mounts a job's feature store ConfigMap into its data
step instead of passing the file's text as a run parameter: the text may hold
a store's credentials, and run parameters are on show in the KFP UI.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Callable

from kfp import compiler

from kubeloop.api.training import TrainingJobSpec
from kubeloop.pipelines.backends.base import BackendUnavailable, PipelineBackend, RunRequest, RunStatus
from kubeloop.pipelines.environment import DEFAULT_STEPS, StepEnvironment

# A finished run's results by run name, read from the model registry.
OutcomeReader = Callable[[str], dict]
PHASES = {"PENDING": "Pending", "RUNNING": "Running", "SUCCEEDED": "Succeeded", "SKIPPED": "Succeeded",
          "FAILED": "Failed", "CANCELING": "Failed", "CANCELED": "Failed", "PAUSED": "Running"}


class KfpBackend(PipelineBackend):
    name = "kfp"

    def __init__(self, endpoint: str, outcomes: OutcomeReader, ui: str | None = None, feast_repo: str = "",
                 tracking_uri: str = "", experiment: str = "kubeloop", namespace: str | None = None,
                 git_sha: str = "unknown", steps: StepEnvironment = DEFAULT_STEPS):
        self.endpoint = endpoint
        self.tensorrt = steps.tensorrt
        self.outcomes = outcomes
        self.ui = (ui or endpoint).rstrip("/")
        self.feast_repo = feast_repo
        self.tracking_uri = tracking_uri
        self.git_sha = git_sha
        self.steps = steps
        self.experiment = experiment
        self.namespace = namespace
        self._cached = None

    def _client(self):  # noqa: ANN202 - kfp.Client
        # kfp.Client probes the server's health on creation (for up to 25 s
        # when it is down) unless a multi-user namespace is given: create it
        # once and reuse it.
        if self._cached is None:
            import kfp

            self._cached = kfp.Client(host=self.endpoint, **({"namespace": self.namespace} if self.namespace else {}))
        return self._cached

    def _call(self, fn):  # noqa: ANN001, ANN202
        """Transport failures and server errors mean "try again later";
        a 4xx is a real error and propagates."""
        import urllib3
        from kfp_server_api.exceptions import ApiException

        try:
            return fn(self._client())
        except ApiException as exc:
            self._cached = None
            if exc.status in (429,) or (exc.status or 500) >= 500:
                raise BackendUnavailable(f"Kubeflow Pipelines at {self.endpoint}: {exc.status} {exc.reason}") from exc
            raise
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            self._cached = None
            raise BackendUnavailable(f"Kubeflow Pipelines at {self.endpoint} is unreachable: {exc}") from exc

    def submit(self, request: RunRequest) -> RunStatus:
        existing = self._find(request.name)
        if existing:
            return self.status(existing)
        with tempfile.TemporaryDirectory() as tmp:
            package = self.compile(request, Path(tmp) / "pipeline.yaml")
            result = self._call(lambda c: c.create_run_from_pipeline_package(
                str(package), arguments=self.arguments(request), run_name=request.name,
                experiment_name=self.experiment, enable_caching=False))
        return self.status(result.run_id)

    def compile(self, request: RunRequest, path: Path) -> Path:
        """The IR this backend submits for the request."""
        compiler.Compiler().compile(_pipeline_for(request, self.steps), str(path))
        return path

    def arguments(self, request: RunRequest) -> dict:
        """The run's parameters: the request's, less the feature store's text
        (mounted from its ConfigMap instead), and what the operator provides."""
        passed = {k: v for k, v in request.arguments.items() if k != "feature_store"}
        return {**passed, "pipeline_run": request.name, "feast_repo": self.feast_repo,
                "tracking_uri": self.tracking_uri, "git_sha": self.git_sha}

    def _find(self, name: str) -> str | None:
        flt = json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": name}]})

        def find(client):  # noqa: ANN001, ANN202
            experiment = client.get_experiment(experiment_name=self.experiment)
            runs = client.list_runs(experiment_id=experiment.experiment_id, filter=flt, page_size=5).runs or []
            return runs[0].run_id if runs else None

        try:
            return self._call(find)
        except ValueError:  # kfp: no experiment of that name yet
            return None

    def status(self, run_id: str) -> RunStatus | None:
        run = self._call(lambda c: c.get_run(run_id))
        if run is None:
            return None
        phase = PHASES.get(str(run.state), "Running")
        error = None
        if phase == "Failed":
            error = getattr(getattr(run, "error", None), "message", None) or f"the KFP run ended {run.state}"
        outputs = self.outcomes(run.display_name) if phase == "Succeeded" else {}
        if phase == "Succeeded" and not outputs:
            phase, error = "Failed", "the run succeeded but registered nothing"
        return RunStatus(run_id=run_id, phase=phase, url=f"{self.ui}/#/runs/details/{run_id}", outputs=outputs,
                         error=error, progress=str(run.state).lower())

    def cancel(self, run_id: str) -> None:
        self._call(lambda c: c.terminate_run(run_id))


def _pipeline_for(request: RunRequest, steps: StepEnvironment):  # noqa: ANN202 - a kfp pipeline
    """The pipeline with this job's compute on its heavy step, its feature
    store's ConfigMap on its data step and the step environment on all."""
    if request.pipeline == "training":
        from kubeloop.pipelines.training import build_training_pipeline

        spec = TrainingJobSpec.from_json(request.arguments["spec"])
        owner_namespace = request.arguments["owner"].split("/", 1)[0]
        store = spec.features.store.config_map if spec.features.store else None
        return build_training_pipeline(spec.resources, spec.distributed, owner_namespace, steps, store)
    if request.pipeline == "optimization":
        from kubeloop.api.optimization import OptimizedModelSpec
        from kubeloop.pipelines.optimization import build_optimization_pipeline

        target = OptimizedModelSpec.from_json(request.arguments["spec"]).target
        return build_optimization_pipeline(target, steps)
    raise ValueError(f"the kfp backend cannot run the {request.pipeline} pipeline")
