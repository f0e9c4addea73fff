"""Operator configuration, read once at start-up from the environment (the
Helm chart sets it; `kubeloop operator` maps its options onto it), parsed
by a pydantic-settings model: each variable is typed, and each bad one gets
a line naming it and what to set it to."""

from __future__ import annotations

import os
import re
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, get_args

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, NoDecode, SettingsConfigDict, SettingsError

from kubeloop.api.jobs import JobResources
from kubeloop.serving.base import PoolSize
from kubeloop.version import COMPONENTS_IMAGE

TritonBackend = Literal["onnxruntime", "python"]
"""The Triton backends a pulled repository can be laid out for (kubeloop.components.triton)."""
DriftMonitorKind = Literal["local", "kubernetes"]
MaterializerKind = Literal["local", "kubernetes"]
GpuAllocation = Literal["device-plugin", "dra"]
TRITON_BACKENDS = get_args(TritonBackend)
Names = Annotated[list[str], NoDecode]
"""A comma-separated list in the environment."""

HINTS = {
    "KUBELOOP_TRITON_BACKEND": "the backends your Triton image has: python for kubeloop's own image",
    "KUBELOOP_DRIFT_MONITOR": "kubernetes on a cluster",
    "KUBELOOP_MATERIALIZER": "kubernetes on a cluster",
    "KUBELOOP_GPU_ALLOCATION": "dra where NVIDIA's DRA driver publishes the GPUs",
}


class ConfigurationError(Exception):
    """The operator's configuration is incomplete or wrong; the message names
    the setting and what to set it to."""


_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("kubeloop_operator_environ", default=None)


class _Environ(EnvSettingsSource):
    """The environment source over a given mapping instead of os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]):
        self._environ = environ
        super().__init__(settings_cls, case_sensitive=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return dict(self._environ)


def _env(name: str, default: Any = None, **kwargs: Any) -> Any:
    return Field(default, validation_alias=name, **kwargs)


class OperatorConfig(BaseSettings):
    model_config = SettingsConfigDict(frozen=True, case_sensitive=True, extra="ignore")

    namespaces: Names = _env("KUBELOOP_NAMESPACES", [])
    """Namespaces to watch; empty means the whole cluster."""
    pipeline_backends: Names = _env("KUBELOOP_PIPELINE_BACKENDS", ["local", "noop"])
    """Pipeline backends to enable (local, kfp, trainer, noop)."""
    default_pipeline_backend: str = _env("KUBELOOP_PIPELINE_BACKEND", "local")
    serving_backends: Names = _env("KUBELOOP_SERVING_BACKENDS", ["kubernetes"])
    """Serving backends to enable (kubernetes, kserve, local)."""
    default_serving_backend: str = _env("KUBELOOP_SERVING_BACKEND", "kubernetes")
    serving_pools: dict[str, PoolSize] = _env("KUBELOOP_SERVING_POOLS", {})
    """Pools of Triton servers InferenceServices may join (spec.pool), as
    JSON: {"<name>": {"members": 2, "memoryMiB": 1024}}: processes on the
    local backend, a Pod in KUBELOOP_OPERATOR_NAMESPACE on the kubernetes
    backend (which needs KUBELOOP_ROUTER_IMAGE for the pool's front)."""
    registry: str = _env("KUBELOOP_REGISTRY", "mlflow")
    """mlflow, or memory (an empty in-process registry, for tests and benchmarks)."""
    tracking_uri: str | None = _env("MLFLOW_TRACKING_URI")
    kfp_endpoint: str | None = _env("KUBELOOP_KFP_ENDPOINT")
    kfp_ui: str | None = _env("KUBELOOP_KFP_UI")
    kfp_namespace: str | None = _env("KUBELOOP_KFP_NAMESPACE")
    """The KFP profile namespace of a multi-user Kubeflow installation."""
    feast_repo: Path | None = _env("KUBELOOP_FEAST_REPO")
    work_dir: Path | None = _env("KUBELOOP_WORK_DIR")
    """Where the local backends keep runs, model repositories and logs (see state_dir)."""
    platform_state_dir: Path | None = _env("KUBELOOP_STATE_DIR")
    """The local platform's state directory, as `kubeloop dev env` exports it."""
    xdg_state_home: Path | None = _env("XDG_STATE_HOME")
    resync_seconds: float = _env("KUBELOOP_RESYNC_SECONDS", 15.0, gt=0)
    """How often every object is reconciled again, whatever happened."""
    resync_per_second: float = _env("KUBELOOP_RESYNC_PER_SECOND", 50.0, gt=0)
    """Resyncs a second that steady InferenceServices share (Ready,
    no rollout or retrain under way): beyond resync_seconds x this many,
    each is reconciled less often (kubeloop.operator.pacing)."""
    triton_image: str = _env("KUBELOOP_TRITON_IMAGE", "nvcr.io/nvidia/tritonserver:24.10-py3")
    triton_backend: TritonBackend = _env("KUBELOOP_TRITON_BACKEND", "onnxruntime")
    """The Triton backend serving Pods load models with: onnxruntime (a stock
    NVIDIA image) or python (an image with only the python backend, such as
    the one `kubeloop dev images` builds from the nvidia-pytriton wheel)."""
    components_image: str = _env("KUBELOOP_COMPONENTS_IMAGE", COMPONENTS_IMAGE)
    """The image of the pipeline steps (kfp backend) and the model pullers."""
    training_image: str | None = _env("KUBELOOP_TRAINING_IMAGE")
    """The image of the trainer backend's Pods (dataset initializer and
    nodes): torch, Feast, MLflow and kubeloop (images/training.txt)."""
    training_bucket: str = _env("KUBELOOP_TRAINING_BUCKET", "training")
    """The bucket of the object store where trainer backend runs keep their
    data and checkpoints, one prefix per namespace and run."""
    mlflow_secret: str | None = _env("KUBELOOP_MLFLOW_SECRET")
    """Name of a Secret with MLflow's credentials (MLFLOW_TRACKING_USERNAME and
    _PASSWORD, or _TOKEN), handed to the pipeline steps by reference."""
    object_store_secret: str | None = _env("KUBELOOP_OBJECT_STORE_SECRET")
    """Name of a Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for
    MLflow's artifact store, handed to the pipeline steps by reference."""
    object_store_endpoint: str | None = _env("KUBELOOP_OBJECT_STORE_ENDPOINT")
    """The artifact store's S3 endpoint as the steps reach it (their MLFLOW_S3_ENDPOINT_URL)."""
    cluster_tracking_uri: str | None = _env("KUBELOOP_CLUSTER_TRACKING_URI")
    """The tracking URI as Pods in the cluster reach it (defaults to tracking_uri)."""
    router_image: str | None = _env("KUBELOOP_ROUTER_IMAGE")
    """The serving front's image (the runtime image): set, the kubernetes
    backend runs a router in front of each InferenceService's versions."""
    registry_secret: str | None = _env("KUBELOOP_REGISTRY_SECRET")
    """Name of a Secret with registry credentials, handed to Pods by reference."""
    gateway: str | None = _env("KUBELOOP_GATEWAY")
    """namespace/name of a Gateway API Gateway; canaries then split by HTTPRoute weights."""
    gateway_domain: str = _env("KUBELOOP_GATEWAY_DOMAIN", "example.com")
    gpu_allocation: GpuAllocation = _env("KUBELOOP_GPU_ALLOCATION", "device-plugin")
    """How serving Pods ask for their GPU slice: device-plugin (extended
    resources) or dra (a ResourceClaim of NVIDIA's DRA driver's devices)."""
    forkserver: bool = _env("KUBELOOP_FORKSERVER", True)
    """Whether the local backends start pipeline steps and monitoring jobs
    from a warm interpreter (kubeloop.forkserver) instead of a fresh one
    each; off, each imports torch, MLflow and Feast again."""
    tensorrt: bool = _env("KUBELOOP_TENSORRT", False)
    """Whether the components image has TensorRT (KUBELOOP_TENSORRT=true)."""
    webhook_port: int = _env("KUBELOOP_WEBHOOK_PORT", 0, ge=0, le=65535)
    """Port of the Alertmanager and MLflow webhooks and /metrics (0: not served)."""
    webhook_address: str = _env("KUBELOOP_WEBHOOK_ADDRESS", "127.0.0.1")
    """Address the webhooks listen on (0.0.0.0 in a Pod)."""
    webhook_token_file: Path | None = _env("KUBELOOP_WEBHOOK_TOKEN_FILE")
    """The bearer token of Alertmanager's calls (read again when the file changes)."""
    mlflow_webhook_secret_file: Path | None = _env("KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE")
    """The MLflow webhooks' signing secret, a secret of its own (read again when the file changes)."""
    mlflow_webhook_url: str | None = _env("KUBELOOP_MLFLOW_WEBHOOK_URL")
    """This operator's /hooks/mlflow as MLflow reaches it; set, the operator registers the webhook."""
    prometheus_targets: Path | None = _env("KUBELOOP_PROMETHEUS_TARGETS")
    """A Prometheus file_sd folder where local routers and Triton servers register."""
    prometheus_url: str | None = _env("KUBELOOP_PROMETHEUS_URL")
    """The Prometheus that scrapes the serving front, whose query API rollouts
    are analysed on (unset: rollouts wait at their first step, and say so)."""
    drift_monitor: DriftMonitorKind = _env("KUBELOOP_DRIFT_MONITOR", "local")
    """Where drift checks run: local (processes beside the operator) or
    kubernetes (a Job per check on the components image; the operator's Pod
    never runs one)."""
    materializer: MaterializerKind = _env("KUBELOOP_MATERIALIZER", "local")
    """How online stores are kept fresh (spec.features.materializeEvery):
    local (Feast in the operator's process, for the local backend only) or
    kubernetes (a Job per run in the operator's namespace on the router
    image; the kubernetes and kserve backends' router Pods then read stores
    kept fresh, and the operator's Pod never runs Feast)."""
    job_resources: JobResources = _env("KUBELOOP_JOB_RESOURCES", JobResources())
    """Requests and limits of the Pods of the operator's own Jobs, as JSON by
    purpose: {"monitoring": {"requests": {"cpu": "250m"}}, "materialize":
    {...}}; a purpose given replaces its defaults whole (sized to what a
    namespace's quota or a small node holds)."""
    operator_namespace: str | None = _env("KUBELOOP_OPERATOR_NAMESPACE")
    """The operator's own namespace (the chart sets it from the Pod's): where
    materialisation Jobs run, with the object store's Secret."""
    request_log: str | None = _env("KUBELOOP_REQUEST_LOG")
    """Where routers log requests, one folder or prefix per InferenceService
    below it: a folder or an s3:// prefix (the kubernetes backend's routers
    need s3://; the local backend defaults to a folder under the work dir)."""

    @field_validator("namespaces", "pipeline_backends", "serving_backends", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        return [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else value

    @field_validator("feast_repo", "work_dir", "platform_state_dir", "xdg_state_home", "webhook_token_file",
                     "mlflow_webhook_secret_file", "prometheus_targets", "request_log", mode="before")
    @classmethod
    def _unset_when_empty(cls, value: Any) -> Any:
        return None if value == "" else value

    @model_validator(mode="after")
    def _together(self) -> "OperatorConfig":
        """Settings that only make sense together."""
        if self.webhook_port and not self.webhook_token_file:
            raise ValueError("KUBELOOP_WEBHOOK_PORT needs KUBELOOP_WEBHOOK_TOKEN_FILE: a file with the "
                             "bearer token Alertmanager sends")
        if self.materializer == "kubernetes" and not self.operator_namespace:
            raise ValueError("KUBELOOP_MATERIALIZER=kubernetes needs KUBELOOP_OPERATOR_NAMESPACE: the namespace "
                             "its materialisation Jobs run in (the chart sets it to the operator's own)")
        if self.mlflow_webhook_url and not self.mlflow_webhook_secret_file:
            raise ValueError("KUBELOOP_MLFLOW_WEBHOOK_URL needs KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE: a file "
                             "with the MLflow webhooks' signing secret (not Alertmanager's token)")
        return self

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: Any, env_settings: Any,
                                   dotenv_settings: Any, file_secret_settings: Any) -> tuple:
        environ = _ENVIRON.get()
        return (init_settings, env_settings if environ is None else _Environ(settings_cls, environ))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "OperatorConfig":
        """The configuration from the environment (os.environ, or the mapping
        given); ConfigurationError names each variable set to something unusable."""
        token = _ENVIRON.set(env)
        try:
            return cls()
        except ValidationError as exc:
            raise ConfigurationError("; ".join(_explain(cls, e) for e in exc.errors())) from None
        except SettingsError as exc:  # a JSON setting that is not JSON
            field = re.search(r'field "(\w+)"', str(exc))
            name = cls.model_fields[field.group(1)].validation_alias if field else "a JSON setting"
            raise ConfigurationError(f"{name}={(env if env is not None else os.environ).get(name)!r}: "
                                     "not JSON; see README, \"Operator configuration\"") from None
        finally:
            _ENVIRON.reset(token)

    @property
    def forkserver_home(self) -> Path | None:
        """Whose fork server the local backends start their processes from:
        the local platform's (one for every operator of it, stopped with it)
        where KUBELOOP_STATE_DIR names it, else the work dir's; None with
        KUBELOOP_FORKSERVER off."""
        if not self.forkserver:
            return None
        return self.platform_state_dir or self.state_dir

    @property
    def state_dir(self) -> Path:
        """Where the local backends keep runs, model repositories and logs:
        KUBELOOP_WORK_DIR, else under the local platform's state directory,
        else the user's own state folder; never a folder every platform and
        operator on the machine shares."""
        if self.work_dir:
            return self.work_dir
        if self.platform_state_dir:
            return self.platform_state_dir / "operator"
        base = self.xdg_state_home or Path.home() / ".local" / "state"
        return base / "kubeloop" / "dev" / "operator"  # kubeloop.dev.platform's default state dir


def _explain(config: type[OperatorConfig], error: dict) -> str:
    """One line for one bad variable: its name, its value, what to set it to."""
    if not error["loc"]:  # a rule over several settings, which names them itself
        return error["msg"].removeprefix("Value error, ")
    name = str(error["loc"][0])
    if len(error["loc"]) > 1:  # within a JSON setting: the path to the bad part
        where = ".".join(str(part) for part in error["loc"][1:])
        return f"{name}: {where}={error['input']!r}: {error['msg'][:1].lower()}{error['msg'][1:]}"
    field = next(f for f in config.model_fields.values() if f.validation_alias == name)
    choices = get_args(field.annotation)
    if choices and all(isinstance(c, str) for c in choices):
        fix = f"set it to {' or '.join(choices)}" + (f" ({HINTS[name]})" if name in HINTS else "")
    elif field.annotation in (int, float):
        what = "a whole number" if field.annotation is int else "a number"
        fix = f"set it to {what} ({error['msg'].lower()}, default {field.default}) or unset it"
    else:
        fix = error["msg"].lower()
    return f"{name}={error['input']!r}: {fix}"
