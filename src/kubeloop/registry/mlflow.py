"""The model registry on an MLflow tracking server."""

from __future__ import annotations

import os

import requests
from mlflow import MlflowClient
from mlflow.entities.model_registry import ModelVersion as MlflowModelVersion
from mlflow.exceptions import MlflowException, RestException

from kubeloop.registry.base import ModelRegistry, ModelVersion, RegistryUnavailable
from kubeloop.registry.headers import defer_feast_headers

defer_feast_headers()

CONNECTIONS_KEPT = 32
"""Kept-alive connections to MLflow: more than the operator's threads that ask it at once."""

# Codes MLflow answers with when a name, version or alias does not exist.
_NOT_FOUND = {"RESOURCE_DOES_NOT_EXIST", "NOT_FOUND"}


def fail_fast() -> None:
    """Make the MLflow client give up on an unreachable server within seconds
    (its default retries for minutes), so callers back off on their own terms."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "15")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    # MLflow's session keeps 10 connections; the operator's handler and
    # resync threads ask it at once, and at 1,000 services its pool was full
    # 111 times in ten minutes, each time a connection thrown away.
    os.environ.setdefault("MLFLOW_HTTP_POOL_MAXSIZE", str(CONNECTIONS_KEPT))


def run_url(tracking_uri: str, run_id: str) -> str:
    """The MLflow UI's page of a run."""
    run = MlflowClient(tracking_uri).get_run(run_id)
    return f"{tracking_uri.rstrip('/')}/#/experiments/{run.info.experiment_id}/runs/{run_id}"


class MlflowRegistry(ModelRegistry):
    def __init__(self, tracking_uri: str):
        self.tracking_uri = tracking_uri
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)

    def get_version(self, name: str, version: str) -> ModelVersion | None:
        return self._call(lambda: self.client.get_model_version(name, str(version)), missing_ok=True)

    def get_alias(self, name: str, alias: str) -> ModelVersion | None:
        return self._call(lambda: self.client.get_model_version_by_alias(name, alias), missing_ok=True)

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self._call(lambda: self.client.set_registered_model_alias(name, alias, str(version)))

    def delete_alias(self, name: str, alias: str) -> None:
        self._call(lambda: self.client.delete_registered_model_alias(name, alias), missing_ok=True)

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self._call(lambda: self.client.set_model_version_tag(name, str(version), key, value))

    def get_model_tags(self, name: str) -> dict[str, str]:
        model = self._call(lambda: self.client.get_registered_model(name), missing_ok=True)
        return dict(model.tags or {}) if model else {}

    def set_model_tag(self, name: str, key: str, value: str) -> None:
        self._call(lambda: self.client.set_registered_model_tag(name, key, value))

    def _call(self, fn, missing_ok: bool = False):  # noqa: ANN001, ANN202 - thin adapter
        try:
            result = fn()
        except MlflowException as exc:
            # A file/sqlite store raises MlflowException where the REST store raises RestException:
            # "not found" means the same thing from both.
            if missing_ok and (exc.error_code in _NOT_FOUND or "not found" in str(exc).lower()):
                return None
            if isinstance(exc, RestException) and exc.get_http_status_code() < 500:
                raise
            raise RegistryUnavailable(f"MLflow at {self.tracking_uri} is unreachable: {exc}") from exc
        except (requests.RequestException, OSError) as exc:
            raise RegistryUnavailable(f"MLflow at {self.tracking_uri} is unreachable: {exc}") from exc
        return _convert(result) if isinstance(result, MlflowModelVersion) else result


def _convert(mv: MlflowModelVersion) -> ModelVersion:
    return ModelVersion(name=mv.name, version=str(mv.version), source=mv.source, run_id=mv.run_id,
                        tags=dict(mv.tags or {}), aliases=tuple(mv.aliases or ()))
