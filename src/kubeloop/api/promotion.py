"""Promotion through registry aliases, and the gates a version must pass."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from kubeloop.api.base import KubeModel
from kubeloop.api.schema import cel

# Registry stages of MLflow's older workflow, accepted wherever an alias is,
# and the alias each one means.
STAGE_ALIASES = {"Production": "champion", "Staging": "challenger", "Archived": "archived"}
ALIAS_PATTERN = r"^([a-z][a-z0-9_-]*|Production|Staging|Archived)$"


def alias_for(name: str) -> str:
    """The registry alias for an alias or a legacy stage name."""
    return STAGE_ALIASES.get(name, name)


class MetricGate(KubeModel):
    """A bound on one evaluation metric."""

    model_config = ConfigDict(
        json_schema_extra=cel(("has(self.min) || has(self.max)", "give min, max or both", "min"))
    )

    metric: str = Field(min_length=1, max_length=64)
    """The metric's name as the evaluation logs it (auc, precision, recall, ...)."""
    min: float | None = None
    """The lowest acceptable value."""
    max: float | None = None
    """The highest acceptable value."""


class PromotionGates(KubeModel):
    """What a new version must show before it is promoted."""

    metrics: list[MetricGate] = Field(default_factory=list, max_length=16)
    """Absolute bounds on evaluation metrics."""
    not_worse_than_champion: bool = True
    """Compare with the current holder of the target alias on the same
    evaluation set; the new version must not be worse on the tuning metric by
    more than the tolerance."""
    tolerance: float = Field(default=0.0, ge=0, le=1)
    """How much worse than the champion still counts as not worse."""
    require_latency_slo: bool = False
    """Promote only versions whose OptimizedModel benchmark met its latency SLO."""


class PromotionPolicy(KubeModel):
    """Which aliases a new version gets."""

    register_as: str = Field(default="challenger", pattern=ALIAS_PATTERN, max_length=64)
    """Alias every newly registered version receives straight away (a legacy
    stage name such as Staging is mapped to its alias)."""
    promote_to: str | None = Field(default=None, pattern=ALIAS_PATTERN, max_length=64)
    """Alias the version moves to once every gate passes, for example champion
    (or Production); omitted means promotion is left to `kubeloop promote`."""
    gates: PromotionGates = Field(default_factory=PromotionGates)
    """The gates checked before promote_to is moved."""
