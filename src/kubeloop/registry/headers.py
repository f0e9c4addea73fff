"""MLflow's request-header plugins as kubeloop's processes load them.

Feast registers one (entry point group `mlflow.request_header_provider`):
it adds a token to the MLflow requests Feast makes inside its own token
scope. MLflow loads every such plugin at a process's first request, and
loading Feast's imports all of Feast, torch with it: about 9 of the 15
CPU-seconds the local operator took to start, in a process that never
reads a feature. The model puller, the outcome Jobs and the CLI paid it too.

The stand-in that takes the plugin's place asks Feast's provider only where
Feast's auth module is loaded. The scope's token lives in that module, so
where it is not loaded no scope can be open and Feast's provider would add
nothing: requests carry the same headers as with the plugin loaded.

defer_feast_headers() is called where processes that never import Feast
first ask MLflow (the operator's registry, webhook and outcome readers, the
serving repository, the outcome Job); Feast's own processes load the plugin
at no cost, as they import Feast anyway.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import EntryPoint

FEAST_AUTH = "feast.infra.data_sources.mlflow.auth"
GROUP = "mlflow.request_header_provider"
_REGISTRY = "mlflow.tracking.request_header.registry"


class FeastHeaders:
    """Feast's MLflow request-header provider, asked where Feast has loaded it."""

    @staticmethod
    def _provider():  # noqa: ANN205 - Feast's FeastMLflowHeaderProvider, or None
        auth = sys.modules.get(FEAST_AUTH)
        return None if auth is None else auth.FeastMLflowHeaderProvider()

    def in_context(self) -> bool:
        provider = self._provider()
        return provider is not None and provider.in_context()

    def request_headers(self) -> dict[str, str]:
        provider = self._provider()
        return {} if provider is None else provider.request_headers()


def standing_in(points: list[EntryPoint]) -> list[EntryPoint]:
    """MLflow's request-header plugins with FeastHeaders in place of Feast's."""
    return [EntryPoint(p.name, f"{__name__}:{FeastHeaders.__name__}", p.group) if p.value.startswith("feast.") else p
            for p in points]


def defer_feast_headers() -> None:
    """Register MLflow's request-header plugins now, FeastHeaders standing in
    for Feast's. A process whose MLflow client has made a request already
    keeps what it registered."""
    if _REGISTRY in sys.modules:
        return
    import mlflow.utils.plugins as plugins

    found = plugins.get_entry_points

    def entry_points(group: str) -> list[EntryPoint]:
        points = list(found(group))
        return standing_in(points) if group == GROUP else points

    # The registry binds get_entry_points and registers its plugins as it is
    # imported, the only time it reads them.
    plugins.get_entry_points = entry_points
    try:
        importlib.import_module(_REGISTRY)
    finally:
        plugins.get_entry_points = found
