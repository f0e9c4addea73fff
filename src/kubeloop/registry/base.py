"""The model registry port: registered versions, their tags and aliases."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field


class RegistryUnavailable(Exception):
    """The registry cannot be reached right now (retry with backoff)."""


@dataclass(frozen=True)
class ModelVersion:
    """One registered version of a model."""

    name: str
    version: str
    source: str
    """Where the version's artifacts are (models:/, runs:/ or a path)."""
    run_id: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()


class ModelRegistry(abc.ABC):
    """Registered models, by name, version and alias."""

    @abc.abstractmethod
    def get_version(self, name: str, version: str) -> ModelVersion | None:
        """A version, or None if the model or version does not exist."""

    @abc.abstractmethod
    def get_alias(self, name: str, alias: str) -> ModelVersion | None:
        """The version an alias points at, or None."""

    @abc.abstractmethod
    def set_alias(self, name: str, alias: str, version: str) -> None:
        """Point the alias at the version."""

    @abc.abstractmethod
    def delete_alias(self, name: str, alias: str) -> None:
        """Remove the alias if it exists."""

    @abc.abstractmethod
    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        """Tag a version."""

    @abc.abstractmethod
    def get_model_tags(self, name: str) -> dict[str, str]:
        """The registered model's own tags (empty if it does not exist)."""

    @abc.abstractmethod
    def set_model_tag(self, name: str, key: str, value: str) -> None:
        """Tag the registered model."""

    def resolve(self, name: str, version: str | None = None, alias: str | None = None) -> ModelVersion | None:
        """The version a reference means (by number or alias)."""
        if alias:
            return self.get_alias(name, alias)
        return self.get_version(name, str(version))
