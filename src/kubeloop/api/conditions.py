"""The conditions each kind reports: their types, what each means, the
reasons it may carry, and what Ready waits for (pure).

Types and reasons are StrEnums: equal to the strings they name, and stored
by pydantic as those plain strings, so the status on the wire reads as it
always did. The CRDs' `status.conditions` description is written from this
catalogue, so `kubectl explain` and the operator cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ConditionType(StrEnum):
    """Every condition type a kubeloop object reports; which kind reports
    which is the kind's KindConditions."""

    READY = "Ready"
    STATUS_VALID = "StatusValid"
    # TrainingJob and OptimizedModel
    FEATURE_STORE_RESOLVED = "FeatureStoreResolved"
    SOURCE_RESOLVED = "SourceResolved"
    TECHNIQUES_SUPPORTED = "TechniquesSupported"
    RUN_SUBMITTED = "RunSubmitted"
    RUN_SUCCEEDED = "RunSucceeded"
    VARIANT_CHOSEN = "VariantChosen"
    MODEL_REGISTERED = "ModelRegistered"
    PROMOTED = "Promoted"
    # InferenceService
    MODEL_RESOLVED = "ModelResolved"
    PLACED = "Placed"
    DEPLOYED = "Deployed"
    CANARY_READY = "CanaryReady"
    ROLLOUT_HEALTHY = "RolloutHealthy"
    DRIFT_MONITORED = "DriftMonitored"
    OUTCOMES_MONITORED = "OutcomesMonitored"
    FEATURES_FRESH = "FeaturesFresh"
    DRIFT_ALERT = "DriftAlert"
    RETRAINING = "Retraining"
    RETRAIN_SUPPRESSED = "RetrainSuppressed"


class Reason(StrEnum):
    """Every reason a condition may carry: a CamelCase word, for machines."""

    READY = "Ready"
    PENDING = "Pending"
    INVALID_SPEC = "InvalidSpec"
    INVALID_STATUS = "InvalidStatus"
    # Reaching the operator's backends and the registry
    BACKEND_NOT_CONFIGURED = "BackendNotConfigured"
    BACKEND_UNAVAILABLE = "BackendUnavailable"
    REGISTRY_UNAVAILABLE = "RegistryUnavailable"
    # Finding what the spec names
    RESOLVED = "Resolved"
    MODEL_NOT_FOUND = "ModelNotFound"
    SOURCE_NOT_FOUND = "SourceNotFound"
    DEFAULT_STORE = "DefaultStore"
    CONFIG_MAP = "ConfigMap"
    FEATURE_STORE_NOT_FOUND = "FeatureStoreNotFound"
    SUPPORTED = "Supported"
    UNSUPPORTED_TECHNIQUE = "UnsupportedTechnique"
    # Pipeline runs (RunSucceeded is Unknown with the run's phase while it goes)
    SUBMITTED = "Submitted"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    PIPELINE_FAILED = "PipelineFailed"
    REGISTERED = "Registered"
    NO_MODEL = "NoModel"
    AWAITING_RUN = "AwaitingRun"
    # Why an optimisation's winner won (kubeloop.components.selection)
    MEASURABLY_FASTER = "MeasurablyFaster"
    INTERVALS_OVERLAP = "IntervalsOverlap"
    NO_VARIANT_MEASURABLY_FASTER = "NoVariantMeasurablyFaster"
    # Promotion, and the states of a retrain and phases of a rollout
    PROMOTED = "Promoted"
    GATE_FAILED = "GateFailed"
    TRAINING = "Training"
    OPTIMIZING = "Optimizing"
    GATING = "Gating"
    CANARY = "Canary"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    ABORTED = "Aborted"
    # Placement and serving
    CAPACITY = "Capacity"
    WAITING_FOR_CAPACITY = "WaitingForCapacity"
    FITS_AFTER_RELAYOUT = "FitsAfterRelayout"
    NO_FITTING_CAPACITY = "NoFittingCapacity"
    AVAILABLE = "Available"
    UPDATING = "Updating"
    ROLLING_OUT = "RollingOut"
    CONTAINERS_FAILING = "ContainersFailing"
    # Monitoring jobs
    NO_MONITOR = "NoMonitor"
    NO_REQUEST_LOG = "NoRequestLog"
    FIRST_RUN = "FirstRun"
    NO_DRIFT = "NoDrift"
    DRIFTED = "Drifted"
    NOT_ENOUGH_ROWS = "NotEnoughRows"
    DRIFT_JOB_FAILED = "DriftJobFailed"
    HOLDING = "Holding"
    DECAYED = "Decayed"
    NOT_ENOUGH_LABELS = "NotEnoughLabels"
    OUTCOME_JOB_FAILED = "OutcomeJobFailed"
    # Online features
    MATERIALIZED = "Materialized"
    MATERIALIZATION_FAILED = "MaterializationFailed"
    STORE_NOT_PUBLISHED = "StoreNotPublished"
    # Drift alerts and the retrains they start
    VALID = "Valid"
    INVALID_ANNOTATION = "InvalidAnnotation"
    SUPPRESSED = "Suppressed"
    STARTED = "Started"


@dataclass(frozen=True)
class ConditionEntry:
    """One condition type of a kind: what it means, and its possible reasons."""

    type: ConditionType
    meaning: str
    """One line, for `kubectl explain`."""
    reasons: tuple[Reason, ...]


@dataclass(frozen=True)
class KindConditions:
    """The conditions one kind reports."""

    required: tuple[ConditionType, ...]
    """What Ready waits for: each of them True."""
    entries: tuple[ConditionEntry, ...]
    """Every type the kind reports, Ready first."""

    def description(self) -> str:
        """status.conditions as `kubectl explain` shows it."""
        lines = ["Kubernetes-style conditions; the phase is derived from them. Each type, what it means and "
                 "its reasons:"]
        lines += [f"- {e.type}: {e.meaning} Reasons: {', '.join(e.reasons)}." for e in self.entries]
        return "\n".join(lines)


def _conditions(required: tuple[ConditionType, ...], *entries: ConditionEntry) -> KindConditions:
    """A kind's conditions with Ready, which the required ones decide, and
    StatusValid, which every kind reports the same way. Ready's reasons are
    its own: it also takes the reason of the first required condition that
    is not True."""
    names = ", ".join(required[:-1]) + f" and {required[-1]}"
    ready = ConditionEntry(
        ConditionType.READY,
        f"True when {names} are; otherwise Pending until each was observed, InvalidSpec for a spec the "
        "operator cannot read, else the reason of the first that is not True.",
        (Reason.READY, Reason.PENDING, Reason.INVALID_SPEC))
    status_valid = ConditionEntry(
        ConditionType.STATUS_VALID,
        "False when status fields that failed validation (a hand edit, a status written by another operator "
        "version) were reset; the rest was kept.",
        (Reason.INVALID_STATUS,))
    return KindConditions(required, (ready, *entries, status_valid))


_RUN_SUBMITTED = ConditionEntry(
    ConditionType.RUN_SUBMITTED, "A pipeline run of the current spec exists on its backend.",
    (Reason.SUBMITTED, Reason.BACKEND_NOT_CONFIGURED, Reason.BACKEND_UNAVAILABLE))
_RUN_SUCCEEDED = ConditionEntry(
    ConditionType.RUN_SUCCEEDED, "The run finished successfully; Unknown with the run's phase while it goes.",
    (Reason.SUCCEEDED, Reason.PIPELINE_FAILED, Reason.PENDING, Reason.RUNNING))
_PROMOTED = ConditionEntry(
    ConditionType.PROMOTED, "spec.promotion.promoteTo points at the registered version, once its gates passed.",
    (Reason.PROMOTED, Reason.GATE_FAILED, Reason.REGISTRY_UNAVAILABLE))
_REGISTERED = (Reason.REGISTERED, Reason.NO_MODEL, Reason.AWAITING_RUN)

TRAINING_JOB_CONDITIONS = _conditions(
    (ConditionType.FEATURE_STORE_RESOLVED, ConditionType.RUN_SUBMITTED, ConditionType.RUN_SUCCEEDED,
     ConditionType.MODEL_REGISTERED),
    ConditionEntry(
        ConditionType.FEATURE_STORE_RESOLVED,
        "The feature store the pipeline reads is known: the operator's default or spec.features.store's ConfigMap.",
        (Reason.DEFAULT_STORE, Reason.CONFIG_MAP, Reason.FEATURE_STORE_NOT_FOUND)),
    _RUN_SUBMITTED,
    _RUN_SUCCEEDED,
    ConditionEntry(
        ConditionType.MODEL_REGISTERED,
        "The run registered a model version (not required on the noop backend, which registers none).",
        _REGISTERED),
    _PROMOTED,
)

OPTIMIZED_MODEL_CONDITIONS = _conditions(
    (ConditionType.SOURCE_RESOLVED, ConditionType.TECHNIQUES_SUPPORTED, ConditionType.RUN_SUBMITTED,
     ConditionType.RUN_SUCCEEDED, ConditionType.MODEL_REGISTERED),
    ConditionEntry(
        ConditionType.SOURCE_RESOLVED, "spec.source names a version in the registry.",
        (Reason.RESOLVED, Reason.SOURCE_NOT_FOUND, Reason.REGISTRY_UNAVAILABLE)),
    ConditionEntry(
        ConditionType.TECHNIQUES_SUPPORTED,
        "Every technique can run on the target, and every metric the spec names is one of the source's task.",
        (Reason.SUPPORTED, Reason.UNSUPPORTED_TECHNIQUE, Reason.INVALID_SPEC)),
    _RUN_SUBMITTED,
    _RUN_SUCCEEDED,
    ConditionEntry(
        ConditionType.VARIANT_CHOSEN,
        "Why the winner won: measurably faster than the source, chosen among overlapping intervals, or the "
        "source kept.",
        (Reason.MEASURABLY_FASTER, Reason.INTERVALS_OVERLAP, Reason.NO_VARIANT_MEASURABLY_FASTER)),
    ConditionEntry(
        ConditionType.MODEL_REGISTERED,
        "The winner is registered as a new version (not required on the noop backend, which registers none).",
        _REGISTERED),
    _PROMOTED,
)

INFERENCE_SERVICE_CONDITIONS = _conditions(
    (ConditionType.MODEL_RESOLVED, ConditionType.PLACED, ConditionType.DEPLOYED),
    ConditionEntry(
        ConditionType.MODEL_RESOLVED, "spec.model, and the canary's and shadow's versions, exist in the registry.",
        (Reason.RESOLVED, Reason.MODEL_NOT_FOUND, Reason.REGISTRY_UNAVAILABLE)),
    ConditionEntry(
        ConditionType.PLACED,
        "The primary version fits the fleet's GPUs as spec.gpu asks (True while it waits for capacity to free).",
        (Reason.CAPACITY, Reason.WAITING_FOR_CAPACITY, Reason.FITS_AFTER_RELAYOUT, Reason.NO_FITTING_CAPACITY)),
    ConditionEntry(
        ConditionType.DEPLOYED,
        "The backend serves the primary version, or the version that answers while new ones load.",
        (Reason.AVAILABLE, Reason.UPDATING, Reason.ROLLING_OUT, Reason.CONTAINERS_FAILING,
         Reason.BACKEND_NOT_CONFIGURED, Reason.BACKEND_UNAVAILABLE)),
    ConditionEntry(
        ConditionType.CANARY_READY, "The canary version answers its share of requests; absent without a canary.",
        (Reason.READY, Reason.ROLLING_OUT, Reason.ROLLED_BACK)),
    ConditionEntry(
        ConditionType.ROLLOUT_HEALTHY,
        "The challenger's rollout (spec.rollout) is not aborted; the reason is the rollout's phase.",
        (Reason.PROGRESSING, Reason.PAUSED, Reason.PROMOTED, Reason.ABORTED)),
    ConditionEntry(
        ConditionType.DRIFT_MONITORED, "What the latest drift job found in the inputs (spec.monitoring).",
        (Reason.NO_DRIFT, Reason.DRIFTED, Reason.FIRST_RUN, Reason.NOT_ENOUGH_ROWS, Reason.DRIFT_JOB_FAILED,
         Reason.NO_MONITOR, Reason.NO_REQUEST_LOG)),
    ConditionEntry(
        ConditionType.OUTCOMES_MONITORED,
        "What the latest outcome job found of the live metric, from late labels (spec.monitoring.groundTruth).",
        (Reason.HOLDING, Reason.DECAYED, Reason.FIRST_RUN, Reason.NOT_ENOUGH_LABELS, Reason.OUTCOME_JOB_FAILED,
         Reason.NO_MONITOR, Reason.NO_REQUEST_LOG, Reason.INVALID_SPEC)),
    ConditionEntry(
        ConditionType.FEATURES_FRESH,
        "The online stores the served versions read are materialised on schedule (spec.features); absent when "
        "none is read.",
        (Reason.MATERIALIZED, Reason.FIRST_RUN, Reason.MATERIALIZATION_FAILED, Reason.STORE_NOT_PUBLISHED)),
    ConditionEntry(
        ConditionType.DRIFT_ALERT,
        "The drift-alert annotation is what the webhook writes; present once it was not.",
        (Reason.VALID, Reason.INVALID_ANNOTATION)),
    ConditionEntry(
        ConditionType.RETRAINING,
        "The drift-triggered retrain (spec.retraining) has not failed; the reason is its state.",
        (Reason.TRAINING, Reason.OPTIMIZING, Reason.GATING, Reason.CANARY, Reason.PROMOTED, Reason.GATE_FAILED,
         Reason.ROLLED_BACK, Reason.FAILED)),
    ConditionEntry(
        ConditionType.RETRAIN_SUPPRESSED,
        "The latest drift alert was set aside (a retrain still running, the cooldown, maxConcurrent) rather than "
        "retrained on.",
        (Reason.SUPPRESSED, Reason.STARTED)),
)
