"""InferenceService: serve a registered model on Triton, on the right slice of
a GPU, with canary and shadow traffic, drift monitoring and retraining."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from kubeloop.api.base import BaseStatus, Duration, KubeModel, ModelRef, VersionSelector
from kubeloop.api.optimization import AccuracyBudget, LatencySLO, Technique
from kubeloop.api.outcomes import GroundTruth, PerformanceMonitoring, PerformanceStatus, Rollout, RolloutStatus
from kubeloop.api.promotion import PromotionPolicy
from kubeloop.api.schema import cel
from kubeloop.api.times import seconds
from kubeloop.api.training import TrainingJobSpec
from kubeloop.gpu.catalog import mig_profile_rule

ServingPhase = Literal["Pending", "Ready", "Degraded", "Failed"]
SharingPolicy = Literal["exclusive", "mig", "mps", "auto"]


class ServingRuntime(KubeModel):
    """The model server."""

    name: Literal["triton"] = "triton"
    """The runtime; Triton Inference Server."""
    protocol: Literal["v2"] = "v2"
    """The inference protocol (KServe v2 / Open Inference Protocol)."""
    image: str | None = Field(default=None, max_length=512)
    """Override of the Triton server image (Kubernetes backend)."""


class MIGSharing(KubeModel):
    """A Multi-Instance GPU slice."""

    profile: str = Field(default="auto", max_length=32)
    """A MIG profile such as 1g.10gb or 3g.40gb, or auto for the smallest profile
    that holds the model's measured GPU memory footprint."""


class MPSSharing(KubeModel):
    """A share of a GPU under the Multi-Process Service."""

    active_thread_percentage: int = Field(default=25, ge=1, le=100)
    """Compute share; becomes CUDA_MPS_ACTIVE_THREAD_PERCENTAGE."""
    memory_limit_mib: int | None = Field(default=None, ge=64)
    """Pinned device memory limit; becomes CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
    Omitted means the model's footprint with headroom."""


class ServingGPU(KubeModel):
    """How the model gets GPU capacity."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("!has(self.mig) || self.sharing in ['mig', 'auto']",
             "mig settings need sharing mig or auto", "mig"),
            ("!has(self.mps) || self.sharing in ['mps', 'auto']",
             "mps settings need sharing mps or auto", "mps"),
            mig_profile_rule(),
        )
    )

    sharing: SharingPolicy = "auto"
    """exclusive (whole GPUs), mig (a MIG slice), mps (an MPS share), or auto:
    the smallest slice, share or GPU of the fleet that fits the footprint and
    the latency SLO."""
    product: str | None = Field(default=None, max_length=128)
    """Restrict placement to one GPU product (its nvidia.com/gpu.product label,
    for example NVIDIA-H100-80GB-HBM3)."""
    count: int = Field(default=1, ge=1, le=8)
    """Whole GPUs per replica with sharing exclusive."""
    mig: MIGSharing | None = None
    """MIG settings."""
    mps: MPSSharing | None = None
    """MPS settings."""
    memory_mib: int | None = Field(default=None, ge=1)
    """The model's GPU memory footprint; omitted means the value measured by its
    OptimizedModel and recorded in the registry."""


class ServingResources(KubeModel):
    """CPU and memory per replica."""

    cpu: int | str = "1"
    """CPU request, as a Kubernetes quantity."""
    memory: int | str = "2Gi"
    """Memory request, as a Kubernetes quantity."""


class Autoscaling(KubeModel):
    """Horizontal scaling on a Triton metric."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("self.minReplicas <= self.maxReplicas", "minReplicas must not exceed maxReplicas",
             "minReplicas"),
        )
    )

    min_replicas: int = Field(default=1, ge=0, le=1000)
    """Fewest replicas."""
    max_replicas: int = Field(default=4, ge=1, le=1000)
    """Most replicas."""
    metric: Literal["queue-time", "inference-rate"] = "queue-time"
    """queue-time: average microseconds a request waits in Triton's queue;
    inference-rate: inferences per second per replica."""
    target: int = Field(default=2000, ge=1)
    """The per-replica target value of the metric."""


class TrafficSplit(VersionSelector):
    """Another version of the same model that receives a share of the traffic."""

    percent: int = Field(ge=0, le=100)
    """Share of requests, 0 to 100."""


class RequestLogging(KubeModel):
    """Log requests and predictions for drift monitoring."""

    enabled: bool = True
    """Whether to log."""
    sample_rate: float = Field(default=1.0, gt=0, le=1)
    """Fraction of requests logged."""
    destination: str | None = Field(default=None, max_length=1024)
    """Where logs go (a folder, or an object-store URI on a real cluster);
    omitted means the operator's default."""


class DriftMonitoring(KubeModel):
    """Compare recent requests with the training data (Evidently)."""

    schedule: Duration = "5m"
    """How often the drift job runs."""
    window: Duration = "1h"
    """How far back the request log is read."""
    features: list[str] = Field(default_factory=list, max_length=64)
    """Features to compare; empty means every model input."""
    drift_share_threshold: float = Field(default=0.3, gt=0, le=1)
    """The dataset counts as drifted when this share of features drift."""
    min_rows: int = Field(default=200, ge=1)
    """Windows with fewer logged rows are not evaluated."""
    ground_truth: GroundTruth | None = None
    """Where late labels land; with it the service is also judged by its
    outcomes (live quality, concept drift, rollout analysis)."""
    performance: PerformanceMonitoring = Field(default_factory=PerformanceMonitoring)
    """How live quality is judged once groundTruth is set."""


class RetrainOptimization(KubeModel):
    """How the retrained model is optimised before serving."""

    techniques: list[Technique] = Field(default_factory=lambda: ["dynamic-int8", "onnx"], max_length=13)
    """Techniques to try."""
    accuracy_budget: AccuracyBudget = Field(default_factory=AccuracyBudget)
    """Accuracy budget."""
    latency_slo: LatencySLO = Field(default_factory=LatencySLO, alias="latencySLO")
    """Latency objective."""


class Retraining(KubeModel):
    """Retrain when drift is detected."""

    template: TrainingJobSpec
    """The TrainingJob spec of a retrain. Its modelName is replaced by the served
    model's name and its time window ends when the retrain starts."""
    lookback: Duration | None = None
    """Train on the last this-long of data (for example 21d); omitted keeps the
    template's window start."""
    cooldown: Duration = "1h"
    """No new retrain starts within this long of the previous one."""
    max_concurrent: int = Field(default=1, ge=1, le=10)
    """Most retrains of this service running at once."""
    optimization: RetrainOptimization | None = None
    """Optimise the retrained model before it is canaried; omitted serves it as trained."""
    canary_percent: int = Field(default=20, ge=0, le=100)
    """Traffic the challenger gets while it is evaluated, without spec.rollout:
    a one-step rollout at this share."""
    canary_duration: Duration = "2m"
    """How long that one step lasts; it is promoted when its analysis passes."""
    promotion: PromotionPolicy = Field(default_factory=lambda: PromotionPolicy(promote_to="champion"))
    """Aliases and gates for the retrained version."""


class OnlineFeatures(KubeModel):
    """Requests that carry entity keys and request-time columns instead of
    the feature vector: the serving path reads the rest from the online store
    of the version's feature store (the views of its signature). The local
    backend reads any recorded store; router Pods (kubernetes and kserve
    backends) read stores recorded as a published feature_store.yaml, and
    take the feature vector only for the others."""

    # CEL's duration() knows no days: 1d is spelt out, the rest compared as durations.
    model_config = ConfigDict(
        json_schema_extra=cel(
            ("!has(self.materializeEvery) || self.materializeEvery == '1d' || (!self.materializeEvery.contains('d') && "
             "duration(self.materializeEvery) >= duration('1s') && duration(self.materializeEvery) <= duration('24h'))",
             "materializeEvery must be from 1s to 1d (for example 30s, 10m, 1h)", "materializeEvery"),
        )
    )

    missing: Literal["default", "reject"] = "default"
    """What a row gets when the online store does not know its entity, or
    holds a value older than its feature view's ttl: default puts the
    training default (0, as the training data's missing values) in its
    place; reject answers 422 naming the entity and the views."""
    materialize_every: Duration | None = None
    """How often the operator loads the newest offline rows of the
    version's feature views into the online store (Feast's incremental
    materialisation), from 1s to 1d; unset, the team keeps its online store
    fresh itself and kubeloop schedules nothing. The lag behind it is
    exported as kubeloop_online_features_lag_seconds;
    KubeloopOnlineFeaturesStale fires when it exceeds three intervals. The
    local backend materialises in the operator's process; the kubernetes and
    kserve backends (with a router image and KUBELOOP_MATERIALIZER=kubernetes,
    as the chart sets them) run each materialisation as a Job in the
    operator's namespace, for stores recorded as a published
    feature_store.yaml whose registry, sources and online store Pods reach;
    a store recorded as a repository folder is not materialised there
    (condition FeaturesFresh, reason StoreNotPublished)."""

    @field_validator("materialize_every")
    @classmethod
    def _bounded_interval(cls, value: str | None) -> str | None:
        if value is not None and not 1 <= seconds(value) <= 86400:
            raise ValueError(f"{value} is outside 1s..1d: materialise at least daily and at most every second")
        return value


class InferenceServiceSpec(KubeModel):
    """A model to serve."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("!has(self.retraining) || has(self.monitoring)",
             "retraining is triggered by drift: set monitoring too", "retraining"),
            ("!has(self.rollout) || has(self.canary) || has(self.retraining)",
             "a rollout moves a challenger: set canary (or retraining) too", "rollout"),
            ("!has(self.rollout) || !has(self.canary) || has(self.model.alias)",
             "a rollout of spec.canary promotes it by moving spec.model's alias: follow an alias (for example "
             "champion)", "model"),
        )
    )

    model: ModelRef
    """The registered model, by alias (follows the alias as it moves) or version."""
    backend: Literal["kubernetes", "kserve", "local"] | None = None
    """kubernetes (Deployments on the cluster), kserve (a KServe
    InferenceService per version, where KServe is installed) or local
    (tritonserver processes on the operator's machine); omitted means the
    operator's default."""
    pool: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    """A pool of Triton servers the operator runs (its
    KUBELOOP_SERVING_POOLS) to serve this service among many: the model is
    loaded on its first request and unloaded, least recently used, when its
    member needs the room. Omitted, the service gets a Triton of its own.
    Local backend: processes; kubernetes and kserve backends: one Pod in
    the operator's namespace."""
    runtime: ServingRuntime = Field(default_factory=ServingRuntime)
    """The model server."""
    resources: ServingResources = Field(default_factory=ServingResources)
    """CPU and memory per replica."""
    gpu: ServingGPU | None = None
    """GPU capacity and sharing; omitted serves on CPU."""
    replicas: int = Field(default=1, ge=0, le=1000)
    """Replicas when autoscaling is off."""
    autoscaling: Autoscaling | None = None
    """Horizontal autoscaling."""
    canary: TrafficSplit | None = None
    """A second version that receives a share of requests."""
    shadow: TrafficSplit | None = None
    """A version that receives a mirrored share of requests; its responses are
    logged, never returned."""
    request_logging: RequestLogging = Field(default_factory=RequestLogging)
    """Request logging for drift monitoring."""
    monitoring: DriftMonitoring | None = None
    """Drift monitoring; omitted means none."""
    retraining: Retraining | None = None
    """Retrain on drift; needs monitoring."""
    features: OnlineFeatures = Field(default_factory=OnlineFeatures)
    """Entity requests: how missing or stale online features are handled, and
    how often the online store is refreshed."""
    rollout: Rollout | None = None
    """Move a challenger to all traffic step by step with analysis at every
    step: spec.canary (its percent is then the steps'), and a retrained
    version; omitted, spec.canary is a static split."""


class Placement(KubeModel):
    """Where and on what the model runs, and why."""

    mode: Literal["cpu", "exclusive", "mig", "mps"]
    """The kind of capacity chosen."""
    resource: str | None = None
    """The extended resource requested, for example nvidia.com/mig-1g.10gb."""
    product: str | None = None
    """The GPU product selected."""
    nodes: list[str] = Field(default_factory=list)
    """Nodes that can host it."""
    reason: str
    """Why this placement was chosen."""


class ServedTraffic(KubeModel):
    """A served version and the share of requests it really gets."""

    role: Literal["primary", "canary", "shadow"]
    """primary, canary, or shadow (which answers copies, never callers)."""
    version: str
    """The registered version in that role."""
    percent: int = Field(ge=0, le=100)
    """Percent of requests it gets (the shadow: percent copied to it), as the
    backend really splits them: a canary split by replica ratio gets its
    replicas' share (20% asked of one primary replica is 50%), and a backend
    that does not mirror gives a shadow 0."""


class DriftStatus(KubeModel):
    """The latest drift evaluation."""

    last_run_at: str | None = None
    """When the latest drift job finished (RFC 3339)."""
    share: float | None = None
    """Share of the compared features that drifted."""
    drifted: bool = False
    """Whether the share reached spec.monitoring.driftShareThreshold."""
    rows: int = 0
    """Logged requests in the evaluated window."""
    features_drifted: list[str] = Field(default_factory=list)
    """Features whose distribution moved."""
    report: str | None = None
    """The Evidently HTML report (an MLflow artifact URI)."""
    message: str | None = None
    """Why the latest run evaluated nothing, or failed."""


class RetrainingStatus(KubeModel):
    """The retrain in progress (or the last one), step by step."""

    state: Literal["Training", "Optimizing", "Gating", "Canary", "Promoted", "GateFailed", "RolledBack",
                   "Failed"]
    """Where the retrain is; Promoted, GateFailed, RolledBack and Failed are final."""
    alert: str
    """The drift alert that started it (fingerprint@startsAt)."""
    training_job: str
    """The TrainingJob it created."""
    optimized_model: str | None = None
    """The OptimizedModel it created."""
    challenger: str | None = None
    """The registered version being evaluated."""
    reason: str | None = None
    """The alert that started it: KubeloopDataDrift or KubeloopConceptDrift."""
    canary_since: str | None = None
    """When the challenger started serving its canary share (RFC 3339)."""
    message: str = ""
    """What happened last, for people."""


class InferenceServiceStatus(BaseStatus):
    """What is served, where, and how well."""

    phase: ServingPhase = "Pending"
    """Pending, Ready, Degraded or Failed."""
    url: str | None = None
    """The endpoint clients call (KServe v2 protocol)."""
    grpc_address: str | None = None
    """host:port where clients call the KServe v2 gRPC protocol, routed as
    url's requests are; unset where the backend serves no gRPC (KServe's
    without kubeloop's router)."""
    model_version: str | None = None
    """The registered version serving the main traffic."""
    canary_version: str | None = None
    """The version receiving the canary share."""
    rolled_back_version: str | None = None
    """A canary version taken out of service because it failed readiness; it
    gets no traffic until spec.canary names another version."""
    shadow_version: str | None = None
    """The version receiving mirrored traffic."""
    traffic: list[ServedTraffic] = Field(default_factory=list, max_length=3)
    """The effective split: each served version and the share of requests it gets."""
    placement: Placement | None = None
    """The placement decision."""
    ready_replicas: int = 0
    """Replicas passing readiness."""
    primary_unready_since: str | None = None
    """When the serving version's readiness checks began to fail while it was
    Ready (RFC 3339): the phase stays Ready through 30 s of failures, then
    says so; unset while they pass."""
    last_retrain_at: str | None = None
    """When the last retrain started (RFC 3339)."""
    retrains: list[str] = Field(default_factory=list, max_length=64)
    """TrainingJobs started by drift, newest last."""
    handled_alerts: list[str] = Field(default_factory=list, max_length=64)
    """Drift alerts already acted on or set aside (fingerprint@startsAt), newest last."""
    drift: DriftStatus | None = None
    """The latest drift evaluation."""
    retraining: RetrainingStatus | None = None
    """The current or last retrain."""
    performance: PerformanceStatus | None = None
    """The latest outcome evaluation (spec.monitoring.groundTruth)."""
    rollout: RolloutStatus | None = None
    """The rollout in progress, or the last one."""
