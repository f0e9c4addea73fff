"""An in-memory model registry, for unit tests of code that uses the port."""

from __future__ import annotations

import dataclasses
import threading

from kubeloop.registry.base import ModelRegistry, ModelVersion


class InMemoryRegistry(ModelRegistry):
    def __init__(self) -> None:
        self._versions: dict[tuple[str, str], ModelVersion] = {}
        self._aliases: dict[tuple[str, str], str] = {}
        self._model_tags: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def add_version(self, name: str, source: str, run_id: str | None = None,
                    tags: dict[str, str] | None = None) -> ModelVersion:
        with self._lock:
            number = 1 + sum(1 for (n, _) in self._versions if n == name)
            version = ModelVersion(name, str(number), source, run_id, dict(tags or {}))
            self._versions[(name, version.version)] = version
            return version

    def get_version(self, name: str, version: str) -> ModelVersion | None:
        with self._lock:
            found = self._versions.get((name, str(version)))
            if found is None:
                return None
            aliases = tuple(a for (n, a), v in self._aliases.items() if n == name and v == found.version)
            return dataclasses.replace(found, aliases=aliases)

    def get_alias(self, name: str, alias: str) -> ModelVersion | None:
        with self._lock:
            version = self._aliases.get((name, alias))
        return self.get_version(name, version) if version else None

    def set_alias(self, name: str, alias: str, version: str) -> None:
        with self._lock:
            if (name, str(version)) not in self._versions:
                raise KeyError(f"{name} version {version} does not exist")
            self._aliases[(name, alias)] = str(version)

    def delete_alias(self, name: str, alias: str) -> None:
        with self._lock:
            self._aliases.pop((name, alias), None)

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        with self._lock:
            found = self._versions[(name, str(version))]
            self._versions[(name, str(version))] = dataclasses.replace(found, tags={**found.tags, key: value})

    def get_model_tags(self, name: str) -> dict[str, str]:
        with self._lock:
            return dict(self._model_tags.get(name, {}))

    def set_model_tag(self, name: str, key: str, value: str) -> None:
        with self._lock:
            self._model_tags.setdefault(name, {})[key] = value
