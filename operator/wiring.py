"""The composition root: the real ports from the operator's configuration."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import kopf

from kubeloop.featurestore.base import FeatureStores
from kubeloop.kube import Kube
from kubeloop.monitoring.base import DRIFT, OUTCOMES, JobKind
from kubeloop.monitoring.outcomes.traffic import PrometheusTraffic
from kubeloop.operator.fleet import FleetView
from kubeloop.operator.ports import Ports
from kubeloop.operator.settings import ConfigurationError, OperatorConfig
from kubeloop.pipelines.backends.base import PipelineBackend
from kubeloop.pipelines.backends.noop import NoopBackend
from kubeloop.registry.base import ModelRegistry
from kubeloop.serving.base import ServingBackend
from kubeloop.serving.builders.workloads import ServingImages
from kubeloop.serving.steady import CleanedUp
from kubeloop.serving.kserve import KServeServing
from kubeloop.serving.kubernetes import KubernetesServing

if TYPE_CHECKING:
    from kubeloop.featurestore.freshness import Materializer
    from kubeloop.monitoring.base import DriftMonitor


def build_registry(config: OperatorConfig) -> ModelRegistry:
    if config.registry == "memory":
        from kubeloop.registry.memory import InMemoryRegistry

        return InMemoryRegistry()
    if not config.tracking_uri:
        raise ConfigurationError("set MLFLOW_TRACKING_URI (or --tracking-uri) to the MLflow server")
    from kubeloop.registry.mlflow import MlflowRegistry, fail_fast

    fail_fast()
    return MlflowRegistry(config.tracking_uri)


def build_pipeline_backends(config: OperatorConfig, kube: Kube | None = None) -> dict[str, PipelineBackend]:
    backends: dict[str, PipelineBackend] = {}
    for name in config.pipeline_backends:
        if name == "noop":
            backends[name] = NoopBackend()
        elif name in ("local", "kfp"):
            backends.update(_pipeline_backend(name, config))
        elif name == "trainer":
            backends[name] = _trainer_backend(config, kube)
        else:
            raise ConfigurationError(f"unknown pipeline backend {name}; use local, kfp, trainer or noop")
    return backends


def _trainer_backend(config: OperatorConfig, kube: Kube | None) -> PipelineBackend:
    from kubeloop.pipelines.backends.outcomes import mlflow_outcomes
    from kubeloop.pipelines.backends.trainer import TrainerBackend
    from kubeloop.components.trainjob import TrainerSettings
    from kubeloop.version import git_sha

    if not config.training_image or not config.tracking_uri or kube is None:
        raise ConfigurationError("the trainer pipeline backend needs KUBELOOP_TRAINING_IMAGE (the training image "
                                 "its Pods run), MLFLOW_TRACKING_URI and a cluster")
    settings = TrainerSettings(image=config.training_image,
                               tracking_uri=config.cluster_tracking_uri or config.tracking_uri,
                               bucket=config.training_bucket, object_store_secret=config.object_store_secret,
                               object_store_endpoint=config.object_store_endpoint,
                               mlflow_secret=config.mlflow_secret, git_sha=git_sha())
    return TrainerBackend(kube, settings, mlflow_outcomes(config.tracking_uri))


def _pipeline_backend(name: str, config: OperatorConfig) -> dict[str, PipelineBackend]:
    if name == "local":
        from kubeloop.pipelines.backends.local import LocalBackend, LocalContext
        from kubeloop.version import git_sha

        if not config.tracking_uri:
            raise ConfigurationError("the local pipeline backend needs MLFLOW_TRACKING_URI "
                                     "(`kubeloop dev env` prints it, and KUBELOOP_FEAST_REPO, the default store)")
        context = LocalContext(feast_repo=str(config.feast_repo or ""), tracking_uri=config.tracking_uri,
                               git_sha=git_sha())
        return {name: LocalBackend(config.state_dir, context, tensorrt=config.tensorrt,
                                   forkserver=config.forkserver_home)}
    from kubeloop.pipelines.backends.kfp import KfpBackend
    from kubeloop.pipelines.backends.outcomes import mlflow_outcomes
    from kubeloop.pipelines.environment import StepEnvironment
    from kubeloop.version import git_sha

    if not config.kfp_endpoint or not config.tracking_uri:
        raise ConfigurationError("the kfp pipeline backend needs KUBELOOP_KFP_ENDPOINT and MLFLOW_TRACKING_URI")
    steps = StepEnvironment(image=config.components_image, mlflow_secret=config.mlflow_secret,
                            object_store_secret=config.object_store_secret,
                            object_store_endpoint=config.object_store_endpoint, tensorrt=config.tensorrt,
                            training_bucket=config.training_bucket)
    return {name: KfpBackend(config.kfp_endpoint, mlflow_outcomes(config.tracking_uri), ui=config.kfp_ui,
                             feast_repo=str(config.feast_repo or ""),
                             tracking_uri=config.cluster_tracking_uri or config.tracking_uri,
                             namespace=config.kfp_namespace, git_sha=git_sha(), steps=steps)}


def build_serving_backends(config: OperatorConfig, kube: Kube, fleet: FleetView | None = None
                           ) -> dict[str, ServingBackend]:
    """fleet: the operator's watch of Pods, read for the cluster backends' container troubles."""
    backends: dict[str, ServingBackend] = {}
    cleaned = CleanedUp()
    for name in config.serving_backends:
        if name in ("kubernetes", "kserve"):
            images = ServingImages(
                triton=config.triton_image, triton_backend=config.triton_backend, puller=config.components_image,
                tracking_uri=config.cluster_tracking_uri or config.tracking_uri or "",
                registry_secret=config.registry_secret, gateway=config.gateway,
                gpu_allocation=config.gpu_allocation,
                gateway_domain=config.gateway_domain, router=config.router_image, request_log=config.request_log,
                object_store_secret=config.object_store_secret, object_store_endpoint=config.object_store_endpoint,
            )
            materialized = config.materializer == "kubernetes"
            backends[name] = (KubernetesServing if name == "kubernetes" else KServeServing)(
                kube, images, materialized, config.serving_pools, config.operator_namespace, cleaned,
                fleet.troubles if fleet else None)
        elif name == "local":
            from kubeloop.serving.local import LocalServing

            if not config.tracking_uri:
                raise ConfigurationError("the local serving backend needs MLFLOW_TRACKING_URI")
            backends[name] = LocalServing(config.state_dir, config.tracking_uri,
                                          log_root=config.request_log or str(config.state_dir / "requests"),
                                          targets=config.prometheus_targets, pools=config.serving_pools)
        else:
            raise ConfigurationError(f"unknown serving backend {name}; use kubernetes, kserve or local")
    return backends


def build_materializer(config: OperatorConfig, serving: dict[str, ServingBackend], kube: Kube) -> Materializer | None:
    """Online stores are kept fresh only for backends that read them: in the
    operator's process for the local backend (the operator's image has no
    Feast, nor pandas, for the others), or as Jobs on a cluster
    (KUBELOOP_MATERIALIZER=kubernetes: the kubernetes and kserve backends'
    router Pods read stores kept fresh, a repository folder the local
    backend reads is still materialised here)."""
    if not any(backend.reads_online_features for backend in serving.values()):
        return None
    from kubeloop.featurestore.freshness import Materializer

    if config.materializer == "kubernetes":
        from kubeloop.operator.materializing import MaterializeJobs, MaterializeJobSettings

        if not config.router_image:
            raise ConfigurationError("KUBELOOP_MATERIALIZER=kubernetes runs Jobs on the router image: "
                                     "set KUBELOOP_ROUTER_IMAGE")
        settings = MaterializeJobSettings(image=config.router_image, namespace=config.operator_namespace or "",
                                          object_store_secret=config.object_store_secret,
                                          object_store_endpoint=config.object_store_endpoint,
                                          resources=config.job_resources.materialize)
        local = _in_process if serving.get("local") and serving["local"].reads_online_features else None
        return Materializer(MaterializeJobs(kube, settings, local=local)).start()
    return Materializer(_in_process).start()


def _in_process(need, end):  # noqa: ANN001, ANN202 - the Materializer's Run, imported only when a store needs it
    from kubeloop.featurestore.store import materialize_views

    return materialize_views(need, end)


def build_monitor(config: OperatorConfig, kube: Kube, kind: JobKind = DRIFT) -> DriftMonitor | None:
    """Monitoring jobs of a kind (drift checks, outcome joins) beside the
    operator, or as Jobs on a cluster; both keep their results under the
    work dir, where /metrics reads them."""
    if not config.tracking_uri:
        return None
    if config.drift_monitor == "kubernetes":
        from kubeloop.monitoring.kubernetes import DriftJobSettings, KubernetesDriftMonitor

        settings = DriftJobSettings(image=config.components_image,
                                    tracking_uri=config.cluster_tracking_uri or config.tracking_uri,
                                    object_store_secret=config.object_store_secret,
                                    object_store_endpoint=config.object_store_endpoint,
                                    feast_repo=str(config.feast_repo or ""), resources=config.job_resources.monitoring)
        return KubernetesDriftMonitor(kube, settings, config.state_dir / kind.folder, kind=kind)
    from kubeloop.monitoring.local import LocalDriftMonitor

    return LocalDriftMonitor(config.state_dir, config.tracking_uri, str(config.feast_repo or ""), kind,
                             forkserver=config.forkserver_home)


def build_ports(config: OperatorConfig, kube: Kube | None = None) -> Ports:
    kube = kube or Kube.from_environment()
    fleet = FleetView(kube, dra=config.gpu_allocation == "dra").start()
    serving = build_serving_backends(config, kube, fleet)
    return Ports(
        registry=build_registry(config),
        pipelines=build_pipeline_backends(config, kube),
        serving=serving,
        fleet=fleet,
        watch_serving_pods=fleet.on_serving_pod,
        default_pipeline_backend=config.default_pipeline_backend,
        default_serving_backend=config.default_serving_backend,
        objects=kube,
        monitor=build_monitor(config, kube),
        outcomes=build_monitor(config, kube, OUTCOMES),
        traffic=PrometheusTraffic(config.prometheus_url) if config.prometheus_url else None,
        features=FeatureStores(str(config.feast_repo or ""), build_materializer(config, serving, kube)),
    )


async def serve_webhooks(config: OperatorConfig, ports: Ports):  # noqa: ANN202 - aiohttp AppRunner
    """Alertmanager's and MLflow's webhooks and /metrics, in kopf's event loop."""
    from prometheus_client import CollectorRegistry

    from kubeloop.monitoring.metrics import DriftCollector, FreshnessCollector, OutcomeCollector
    from kubeloop.operator.webhooks import SecretFile, WebhookConfig, Webhooks, keep_mlflow_webhook, serve

    token, mlflow_secret = SecretFile(config.webhook_token_file), SecretFile(config.mlflow_webhook_secret_file)
    if not token.value():
        raise kopf.PermanentError(f"KUBELOOP_WEBHOOK_TOKEN_FILE ({config.webhook_token_file}) holds no token")
    metrics = CollectorRegistry()
    metrics.register(DriftCollector(config.state_dir / DRIFT.folder))
    metrics.register(OutcomeCollector(config.state_dir / OUTCOMES.folder))
    if ports.features.materializes:
        metrics.register(FreshnessCollector(ports.features))
    webhooks = Webhooks(ports.objects, WebhookConfig(token.value, mlflow_secret.value, tuple(config.namespaces)),
                        metrics)
    runner = await serve(webhooks, config.webhook_address, config.webhook_port)
    keeper = None
    if config.mlflow_webhook_url and config.tracking_uri:
        keeper = asyncio.create_task(keep_mlflow_webhook(config.tracking_uri, config.mlflow_webhook_url,
                                                         mlflow_secret.value))
    return runner, keeper
