"""A pool Pod's model repository kept in step with its routes: what the
pool's `repository` container runs (`kubeloop serving pool-sync`).

The operator writes each pooled service's router file into the pool's
routes ConfigMap; the kubelet puts them in a folder of the Pod. This loop
fetches every version a file names from the registry into the repository
the pool's Tritons share (as the local backend does for a local pool,
kubeloop.serving.repository.put_pooled), and only then copies the file into
the folder the pool's front serves from: the front never routes to a model
whose files are not there yet, and is not ready before this loop's first
round has handed it every route it could. A removed file is taken from the front's
folder first, then its model from the repository. A version that cannot be
fetched (the registry down, a version deleted) is tried again next round,
with the others going ahead, and said in the log.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kubeloop.files import write_if_changed
from kubeloop.serving.repository import put_pooled, remove_pooled

log = logging.getLogger("kubeloop.poolsync")
SYNC_SECONDS = 1.0


@dataclass(frozen=True)
class PoolFolders:
    routes: Path
    """The routes as the operator wrote them (a ConfigMap volume)."""
    served: Path
    """The routes whose versions are in the repository: what the front reads."""
    repository: Path
    work: Path
    """Fetched files and each version's own config."""

    @property
    def synced(self) -> Path:
        """Written once the first round has handed the front every route it
        could: the front is ready from then on (the pool's front_config)."""
        return self.served / ".synced"


def versions_of(route: dict) -> tuple[list[str], str]:
    """Every version a router file serves, and its primary (pure)."""
    served = [r["version"] for r in route["routes"]] + ([route["shadow"]["version"]] if route.get("shadow") else [])
    primary = next(r["version"] for r in route["routes"] if r["role"] == "primary")
    return served, primary


Fetch = Callable[[str, list[str], str, str], None]
"""(registered model, versions, primary, the pooled Triton name) -> the versions in the repository."""


def sync_once(folders: PoolFolders, fetch: Fetch) -> list[str]:
    """One round; what could not be taken up (empty: the front's folder
    matches the routes). The first marks the folder synced."""
    folders.served.mkdir(parents=True, exist_ok=True)
    wanted = {path.name: path.read_text() for path in folders.routes.glob("*.json")}
    for gone in sorted(p for p in folders.served.glob("*.json") if p.name not in wanted):
        name = json.loads(gone.read_text())["triton_model"]
        gone.unlink()
        remove_pooled(name, folders.repository, folders.work)
        log.info("%s left the pool", name)
    problems = []
    for file, text in sorted(wanted.items()):
        served = folders.served / file
        if served.exists() and served.read_text() == text:
            continue
        try:
            route = json.loads(text)
            versions, primary = versions_of(route)
            fetch(route["model"], versions, primary, route["triton_model"])
        except Exception as exc:  # one service's trouble must not hold the others back
            problems.append(f"{file}: {exc}")
            continue
        write_if_changed(served, text)
        log.info("%s serves versions %s", route["triton_model"], ", ".join(versions))
    if not folders.synced.exists():
        folders.synced.touch()
    return problems


def run(folders: PoolFolders, tracking_uri: str, backend: str) -> None:
    """Sync every SYNC_SECONDS, for ever; problems are logged when they
    change, not every round."""
    def fetch(model: str, versions: list[str], primary: str, name: str) -> None:
        put_pooled(tracking_uri, model, versions, primary, name, folders.repository, folders.work, backend)

    said: list[str] = []
    while True:
        problems = sync_once(folders, fetch)
        if problems != said:
            for problem in problems:
                log.warning("cannot fetch %s (trying again)", problem)
            said = problems
        time.sleep(SYNC_SECONDS)
