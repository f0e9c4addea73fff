"""Building blocks shared by the three kinds: the model base class, conditions,
the status every kind reports, and references to registered models."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from kubeloop.api.schema import cel


class KubeModel(BaseModel):
    """Base of every API object: camelCase on the wire, snake_case in Python.

    Unknown fields are ignored rather than rejected: the API server already
    prunes them, and an operator one version behind must still read newer
    objects.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        use_attribute_docstrings=True,
    )

    def to_wire(self) -> dict:
        """The object as it is written to the API server (camelCase, no nulls)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def to_json(self) -> str:
        """The wire form as JSON text, each value keeping its JSON type: how a
        spec travels to a pipeline's steps (kubeloop.components.ops says why
        not as a dict)."""
        return self.model_dump_json(by_alias=True, exclude_none=True)

    @classmethod
    def from_json(cls, text: str) -> Self:
        """The object to_json wrote."""
        return cls.model_validate_json(text)


# A Kubernetes-style duration: "90s", "15m", "1h30m", "7d".
Duration = Annotated[str, Field(pattern=r"^([0-9]+(ms|s|m|h|d))+$", max_length=32)]

ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(KubeModel):
    """One aspect of the object's state, in the shape Kubernetes uses everywhere."""

    type: str = Field(max_length=64)
    """What the condition reports on: Ready, or another of the types status.conditions lists."""
    status: ConditionStatus
    """True, False or Unknown."""
    reason: str = Field(max_length=128)
    """A CamelCase word that says why, for machines (for example InvalidSpec)."""
    message: str = Field(default="", max_length=32768)
    """What happened and, where the user can act, what to do, for people."""
    last_transition_time: str
    """When the status last changed (RFC 3339)."""
    observed_generation: int = 0
    """The metadata.generation the condition was computed from."""


class BaseStatus(KubeModel):
    """The status contract every kind keeps."""

    observed_generation: int | None = None
    """The metadata.generation the operator last reconciled."""
    conditions: list[Condition] = Field(default_factory=list, max_length=32)
    """Kubernetes-style conditions; the phase is derived from them."""


class VersionSelector(KubeModel):
    """A registered version, by number or by alias."""

    model_config = ConfigDict(
        json_schema_extra=cel(
            ("has(self.version) != has(self.alias)",
             "set exactly one of version or alias", "version"),
        )
    )

    version: str | None = Field(default=None, pattern=r"^[0-9]+$", max_length=16)
    """A registered version number, for example "3". Mutually exclusive with alias."""
    alias: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9_-]*$", max_length=64)
    """A registry alias such as champion or challenger; the reference follows the
    alias when it moves. Mutually exclusive with version."""


class ModelRef(VersionSelector):
    """A model in the registry, by version or by alias."""

    name: str = Field(min_length=1, max_length=253)
    """The registered model's name in the model registry (MLflow)."""

    @property
    def uri(self) -> str:
        """The MLflow models:/ URI of the reference."""
        if self.alias:
            return f"models:/{self.name}@{self.alias}"
        return f"models:/{self.name}/{self.version}"


class RegisteredModel(KubeModel):
    """A concrete registered model version, as reported in status."""

    name: str
    """The registered model's name."""
    version: str
    """The registered version number."""
    uri: str | None = None
    """The models:/ URI that loads this version."""
    run_url: str | None = None
    """The tracking server's page of the run that produced the version."""
