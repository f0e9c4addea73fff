"""Judging a served model by its outcomes: where late ground truth lands and
how it joins the logged predictions, how far the live metric may fall
before the service counts as decayed, and rollouts that move a challenger
through traffic steps with analysis at every step."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from kubeloop.api.base import Duration, KubeModel
from kubeloop.api.schema import cel

ROLLOUT_ACTIONS = ("pause", "resume", "promote", "abort")
"""What a person may ask of a rollout (`kubeloop rollout ...`, or the
annotation signals.kubeloop.dev/rollout for kubectl users)."""


class GroundTruth(KubeModel):
    """Late labels: where they land and how each joins the prediction it
    judges. A label row holds the request key the caller sent (the v2
    request's `id`, or the X-Request-Key header), the label, and when the
    label became known; the front logs every sampled prediction with that
    key, sampling by the key's hash so a logged request's label always
    finds it."""

    location: str = Field(min_length=1, max_length=1024)
    """Parquet labels: a file, a folder of files, or an s3:// prefix (the
    request log's object store credentials)."""
    key_column: str = Field(default="request_id", max_length=128)
    """The label's column holding the request key."""
    row_column: str = Field(default="row", max_length=128)
    """For requests of several rows: the label's column naming the row (from
    0); labels without this column judge row 0."""
    label_column: str = Field(default="label", max_length=128)
    """The label's column holding the outcome (0/1 for binary, a class label,
    a number for regression)."""
    timestamp_column: str = Field(default="label_timestamp", max_length=128)
    """The label's column holding when it became known."""
    max_delay: Duration = "7d"
    """The longest a label is worth waiting for: one that arrives later than
    this after its prediction is counted as late and not used."""


class PerformanceMonitoring(KubeModel):
    """Live quality: the task's metric over predictions whose labels have
    arrived, per served version, against the metric the version was trained
    to (its registered evaluation)."""

    metric: str | None = Field(default=None, max_length=64)
    """A metric of the task's catalogue (auc, accuracy, macro_f1, log_loss,
    rmse, ...); omitted means the task's primary metric."""
    max_drop: float = Field(default=0.05, ge=0)
    """How much worse than at training time the live metric may get, in the
    metric's unit, before KubeloopConceptDrift fires (and retrains, with
    retraining set). The drop must be clear of this with 95% confidence."""
    window: Duration = "1d"
    """How far back predictions are judged (by when they were made)."""
    schedule: Duration = "5m"
    """How often the outcome job runs."""
    min_rows: int = Field(default=200, ge=1)
    """Fewest labelled predictions of a version before its live metric counts."""


class RolloutStep(KubeModel):
    """One step of a rollout: the challenger's share, and how long it holds it."""

    weight: int = Field(ge=1, le=100)
    """Percent of requests the challenger answers during this step."""
    duration: Duration = "1m"
    """How long the step lasts; it advances only when its analysis passes."""


class RolloutAnalysis(KubeModel):
    """The guardrails every step is judged on: the challenger against the
    champion on the same keyed traffic."""

    max_error_rate_increase: float = Field(default=0.01, ge=0, le=1)
    """How much higher the challenger's share of failed requests may be."""
    max_latency_ratio: float = Field(default=1.5, gt=1)
    """How many times the champion's p99 latency the challenger's may be."""
    latency_tolerance: Duration = "10ms"
    """A challenger's p99 at most this much above the champion's passes
    whatever the ratio: the ratio of two small latencies is noise (on CI's
    busy 2-core node a challenger as fast as the champion once read 5.35x
    its p99 of a few milliseconds)."""
    max_disagreement: float = Field(default=0.5, ge=0, le=1)
    """The share of paired requests (answered by both versions) on which the
    two may decide differently. A retrain on a moved world is meant to
    decide otherwise on some requests (the outcome story's retrain differed
    on 10-14% of them), so the default catches only a challenger that is
    as often against the champion as with it."""
    max_loss_increase: float = Field(default=0.0, ge=0)
    """How much higher the challenger's mean loss per labelled request may be
    than the champion's on the same requests (log loss for binary and
    multiclass tasks, squared error for regression), once labels arrive
    (spec.monitoring.groundTruth)."""
    alpha: float = Field(default=0.05, gt=0, lt=0.5)
    """The false-alarm rate of the sequential tests, however often they look."""
    min_requests: int = Field(default=50, ge=1)
    """Requests the challenger must answer in a step before the step can pass."""
    min_labelled: int = Field(default=0, ge=0)
    """Paired requests whose labels arrived before a step can pass (with
    spec.monitoring.groundTruth); 0: labels judge a rollout when they come,
    but never hold a step back."""


class Rollout(KubeModel):
    """Move a challenger (spec.canary, or a retrained version) to all
    traffic step by step, aborting at the first step whose analysis fails."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("self.steps.all(s, self.steps.exists_one(t, t.weight == s.weight))",
             "step weights must differ from each other", "steps"),
        )
    )

    steps: list[RolloutStep] = Field(min_length=1, max_length=10)
    """Steps in order, for example 5%, 25%, 50%; after the last one passes
    the challenger is promoted."""
    analysis: RolloutAnalysis = Field(default_factory=RolloutAnalysis)
    """The guardrails of every step."""


class LiveMetric(KubeModel):
    """A version's live metric with its 95% interval."""

    version: str
    """The registered version."""
    role: str
    """primary, canary, or paired (the champion's answers to requests the
    challenger answered)."""
    rows: int
    """Predictions with arrived labels."""
    value: float | None = None
    """The metric over them."""
    low: float | None = None
    """The interval's low end."""
    high: float | None = None
    """The interval's high end."""
    trained: float | None = None
    """The metric the version was registered with (held-out evaluation)."""


class PerformanceStatus(KubeModel):
    """The latest outcome evaluation."""

    last_run_at: str | None = None
    """When the latest outcome job finished (RFC 3339)."""
    metric: str | None = None
    """The metric judged."""
    versions: list[LiveMetric] = Field(default_factory=list, max_length=8)
    """Each served version's live metric."""
    labels: dict[str, int] = Field(default_factory=dict)
    """Labels in the window by what became of them: matched, late,
    duplicate, unmatched, not_sampled, invalid."""
    decayed: bool = False
    """Whether the primary's live metric fell more than maxDrop below its
    training-time metric, with confidence."""
    report: str | None = None
    """The report logged to MLflow."""
    message: str | None = None
    """Why the latest run judged nothing, or failed."""


class StepAnalysis(KubeModel):
    """What a rollout step's analysis measured."""

    requests: int = 0
    """Requests the challenger answered in the step."""
    error_rate: float | None = None
    """The challenger's share of failed requests."""
    champion_error_rate: float | None = None
    """The champion's."""
    latency_ratio: float | None = None
    """The challenger's p99 over the champion's."""
    disagreement: float | None = None
    """Share of paired requests decided differently."""
    loss_difference: float | None = None
    """Challenger minus champion: mean loss per labelled request, on the same requests."""
    labelled: int = 0
    """Paired requests whose labels have arrived."""
    verdict: Literal["Pass", "Fail", "Inconclusive"] = "Inconclusive"
    """Whether the step's guardrails hold."""
    message: str = ""
    """Which guardrail decided, for people."""


class RolloutStatus(KubeModel):
    """The rollout in progress, or the last one."""

    challenger: str
    """The version being rolled out."""
    champion: str
    """The version it replaces."""
    phase: Literal["Progressing", "Paused", "Promoted", "Aborted"] = "Progressing"
    """Promoted and Aborted are final."""
    step: int = 0
    """The current step (from 0)."""
    weight: int = 0
    """The challenger's share now (0 once aborted)."""
    step_started_at: str | None = None
    """When the current step began (RFC 3339)."""
    analysis: StepAnalysis | None = None
    """The current step's latest analysis."""
    action: str | None = None
    """The last hand action taken (the annotation's value)."""
    message: str = ""
    """What happened last, for people."""
