"""Operator configuration, read once at start-up from the environment (the
Helm chart sets it; `kubeloop operator` maps its options onto it)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kubeloop.version import COMPONENTS_IMAGE

# The Triton backends a pulled repository can be laid out for (kubeloop.components.triton).
TRITON_BACKENDS = ("onnxruntime", "python")
DRIFT_MONITORS = ("local", "kubernetes")
GPU_ALLOCATIONS = ("device-plugin", "dra")


class ConfigurationError(Exception):
    """The operator's configuration is incomplete or wrong; the message names
    the setting and what to set it to."""


def _list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _number(env: dict[str, str], name: str, default: str, kind: type = int) -> int | float:
    raw = env.get(name, default)
    try:
        return kind(raw)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ConfigurationError(f"{name}={raw!r} is not {what}; set it to {what} (default {default}) "
                                 "or unset it") from None


def _path(env: dict[str, str], name: str) -> Path | None:
    return Path(env[name]) if env.get(name) else None


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: list[str] = field(default_factory=list)
    """Namespaces to watch; empty means the whole cluster."""
    pipeline_backends: list[str] = field(default_factory=lambda: ["local", "noop"])
    """Pipeline backends to enable (local, kfp, noop)."""
    default_pipeline_backend: str = "local"
    serving_backends: list[str] = field(default_factory=lambda: ["kubernetes"])
    """Serving backends to enable (kubernetes, kserve, local)."""
    default_serving_backend: str = "kubernetes"
    registry: str = "mlflow"
    """mlflow, or memory (an empty in-process registry, for tests and benchmarks)."""
    tracking_uri: str | None = None
    kfp_endpoint: str | None = None
    kfp_ui: str | None = None
    kfp_namespace: str | None = None
    """The KFP profile namespace of a multi-user Kubeflow installation."""
    feast_repo: Path | None = None
    state_dir: Path = field(default_factory=lambda: default_work_dir())
    """Where the local backends keep runs, model repositories and logs."""
    resync_seconds: float = 15.0
    """How often every object is reconciled again, whatever happened."""
    triton_image: str = "nvcr.io/nvidia/tritonserver:24.10-py3"
    triton_backend: str = "onnxruntime"
    """The Triton backend serving Pods load models with: onnxruntime (a stock
    NVIDIA image) or python (an image with only the python backend, such as
    the one `kubeloop dev images` builds from the nvidia-pytriton wheel)."""
    components_image: str = COMPONENTS_IMAGE
    """The image of the pipeline steps (kfp backend) and the model pullers."""
    mlflow_secret: str | None = None
    """Name of a Secret with MLflow's credentials (MLFLOW_TRACKING_USERNAME and
    _PASSWORD, or _TOKEN), handed to the pipeline steps by reference."""
    object_store_secret: str | None = None
    """Name of a Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for
    MLflow's artifact store, handed to the pipeline steps by reference."""
    object_store_endpoint: str | None = None
    """The artifact store's S3 endpoint as the steps reach it (their MLFLOW_S3_ENDPOINT_URL)."""
    cluster_tracking_uri: str | None = None
    """The tracking URI as Pods in the cluster reach it (defaults to tracking_uri)."""
    router_image: str | None = None
    """The serving front's image (the runtime image): set, the kubernetes
    backend runs a router in front of each InferenceService's versions."""
    registry_secret: str | None = None
    """Name of a Secret with registry credentials, handed to Pods by reference."""
    gateway: str | None = None
    """namespace/name of a Gateway API Gateway; canaries then split by HTTPRoute weights."""
    gateway_domain: str = "example.com"
    gpu_allocation: str = "device-plugin"
    """How serving Pods ask for their GPU slice: device-plugin (extended
    resources) or dra (a ResourceClaim of NVIDIA's DRA driver's devices)."""
    tensorrt: bool = False
    """Whether the components image has TensorRT (KUBELOOP_TENSORRT=true)."""
    webhook_port: int = 0
    """Port of the Alertmanager and MLflow webhooks and /metrics (0: not served)."""
    webhook_address: str = "127.0.0.1"
    """Address the webhooks listen on (0.0.0.0 in a Pod)."""
    webhook_token_file: Path | None = None
    """The bearer token of Alertmanager's calls (read again when the file changes)."""
    mlflow_webhook_secret_file: Path | None = None
    """The MLflow webhooks' signing secret, a secret of its own (read again when the file changes)."""
    mlflow_webhook_url: str | None = None
    """This operator's /hooks/mlflow as MLflow reaches it; set, the operator registers the webhook."""
    prometheus_targets: Path | None = None
    """A Prometheus file_sd folder where local routers and Triton servers register."""
    drift_monitor: str = "local"
    """Where drift checks run: local (processes beside the operator) or
    kubernetes (a Job per check on the components image; the operator's Pod
    never runs one)."""
    request_log: str | None = None
    """Where routers log requests, one folder or prefix per InferenceService
    below it: a folder or an s3:// prefix (the kubernetes backend's routers
    need s3://; the local backend defaults to a folder under the work dir)."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "OperatorConfig":
        """The configuration from the environment; ConfigurationError names a
        variable that is set to something unusable."""
        env = dict(os.environ if env is None else env)
        get = env.get
        defaults = cls()
        config = cls(
            namespaces=_list(get("KUBELOOP_NAMESPACES", "")),
            pipeline_backends=_list(get("KUBELOOP_PIPELINE_BACKENDS", "local,noop")),
            default_pipeline_backend=get("KUBELOOP_PIPELINE_BACKEND", defaults.default_pipeline_backend),
            serving_backends=_list(get("KUBELOOP_SERVING_BACKENDS", "kubernetes")),
            default_serving_backend=get("KUBELOOP_SERVING_BACKEND", defaults.default_serving_backend),
            registry=get("KUBELOOP_REGISTRY", defaults.registry),
            tracking_uri=get("MLFLOW_TRACKING_URI"),
            kfp_endpoint=get("KUBELOOP_KFP_ENDPOINT"),
            kfp_ui=get("KUBELOOP_KFP_UI"),
            kfp_namespace=get("KUBELOOP_KFP_NAMESPACE"),
            feast_repo=_path(env, "KUBELOOP_FEAST_REPO"),
            state_dir=_path(env, "KUBELOOP_WORK_DIR") or default_work_dir(env),
            resync_seconds=_number(env, "KUBELOOP_RESYNC_SECONDS", str(defaults.resync_seconds), float),
            triton_image=get("KUBELOOP_TRITON_IMAGE", defaults.triton_image),
            triton_backend=get("KUBELOOP_TRITON_BACKEND", defaults.triton_backend),
            components_image=get("KUBELOOP_COMPONENTS_IMAGE", defaults.components_image),
            mlflow_secret=get("KUBELOOP_MLFLOW_SECRET"),
            object_store_secret=get("KUBELOOP_OBJECT_STORE_SECRET"),
            object_store_endpoint=get("KUBELOOP_OBJECT_STORE_ENDPOINT"),
            cluster_tracking_uri=get("KUBELOOP_CLUSTER_TRACKING_URI"),
            router_image=get("KUBELOOP_ROUTER_IMAGE"),
            registry_secret=get("KUBELOOP_REGISTRY_SECRET"),
            gateway=get("KUBELOOP_GATEWAY"),
            gateway_domain=get("KUBELOOP_GATEWAY_DOMAIN", defaults.gateway_domain),
            gpu_allocation=get("KUBELOOP_GPU_ALLOCATION", defaults.gpu_allocation),
            tensorrt=get("KUBELOOP_TENSORRT", "false").lower() == "true",
            webhook_port=_number(env, "KUBELOOP_WEBHOOK_PORT", "0"),
            webhook_address=get("KUBELOOP_WEBHOOK_ADDRESS", defaults.webhook_address),
            mlflow_webhook_url=get("KUBELOOP_MLFLOW_WEBHOOK_URL"),
            prometheus_targets=_path(env, "KUBELOOP_PROMETHEUS_TARGETS"),
            webhook_token_file=_path(env, "KUBELOOP_WEBHOOK_TOKEN_FILE"),
            mlflow_webhook_secret_file=_path(env, "KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE"),
            request_log=env.get("KUBELOOP_REQUEST_LOG") or None,
            drift_monitor=get("KUBELOOP_DRIFT_MONITOR", "local"),
        )
        config.check()
        return config

    def check(self) -> None:
        """Settings that only make sense together."""
        if not 0 <= self.webhook_port <= 65535:
            raise ConfigurationError(f"KUBELOOP_WEBHOOK_PORT={self.webhook_port} is not a port (0-65535)")
        if self.triton_backend not in TRITON_BACKENDS:
            raise ConfigurationError(f"KUBELOOP_TRITON_BACKEND={self.triton_backend!r} is not a Triton backend kubeloop "
                                     f"lays out; set it to {' or '.join(TRITON_BACKENDS)} (the backends your Triton "
                                     "image has: python for kubeloop's own image)")
        if self.drift_monitor not in DRIFT_MONITORS:
            raise ConfigurationError(f"KUBELOOP_DRIFT_MONITOR={self.drift_monitor!r}: set it to "
                                     f"{' or '.join(DRIFT_MONITORS)} (kubernetes on a cluster)")
        if self.gpu_allocation not in GPU_ALLOCATIONS:
            raise ConfigurationError(f"KUBELOOP_GPU_ALLOCATION={self.gpu_allocation!r}: set it to "
                                     f"{' or '.join(GPU_ALLOCATIONS)} (dra where NVIDIA's DRA driver publishes "
                                     "the GPUs)")
        if self.webhook_port and not self.webhook_token_file:
            raise ConfigurationError("KUBELOOP_WEBHOOK_PORT needs KUBELOOP_WEBHOOK_TOKEN_FILE: a file with the "
                                     "bearer token Alertmanager sends")
        if self.mlflow_webhook_url and not self.mlflow_webhook_secret_file:
            raise ConfigurationError("KUBELOOP_MLFLOW_WEBHOOK_URL needs KUBELOOP_MLFLOW_WEBHOOK_SECRET_FILE: a file "
                                     "with the MLflow webhooks' signing secret (not Alertmanager's token)")


def default_work_dir(env: dict[str, str] | None = None) -> Path:
    """Under the local platform's state directory (KUBELOOP_STATE_DIR, as
    `kubeloop dev env` prints it), else the user's own state folder: never a
    folder every platform and operator on the machine shares."""
    env = os.environ if env is None else env
    if env.get("KUBELOOP_STATE_DIR"):
        return Path(env["KUBELOOP_STATE_DIR"]) / "operator"
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "kubeloop" / "dev" / "operator"  # kubeloop.dev.platform's default state dir
