"""Pools on this machine: InferenceServices that name a pool (spec.pool)
share its Triton servers (explicit model control, one repository) and one
front (kubeloop.front.poolfront), instead of a Triton and a router each.

A pool is sized by the platform engineer (the operator's
KUBELOOP_SERVING_POOLS: members and each member's memory budget); a service
joins one by naming it. The backend puts the service's versions into the
pool's repository as a Triton model of the service's own
(namespace.name), writes its routes into the pool's routes folder and
leaves loading to the front: a model is loaded on its first request and
unloaded when its member needs the room. Everything is recorded in the
pool's folder, as for a dedicated service (kubeloop.serving.instances).
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
from collections import defaultdict
from pathlib import Path
from typing import Callable

import requests

from kubeloop import processes
from kubeloop.api.refs import ObjectRef
from kubeloop.files import write_if_changed
from kubeloop.serving.base import (
    PoolSize, ServingRequest, ServingState, pooled_answering, pooled_name, pooled_readiness, taken_out,
    unknown_pool)
from kubeloop.serving.instances import InstanceState, ensure_process
from kubeloop.serving.repository import put_pooled, remove_pooled
from kubeloop.serving.routes import build_router_config
from kubeloop.serving.runtime import TritonRuntime

MEMBER_PORTS = ("http", "grpc", "metrics")


class LocalPools:
    def __init__(self, root: Path, tracking_uri: str, sizes: dict[str, PoolSize],
                 runtime: Callable[[], TritonRuntime], targets: Path | None = None):
        self.root = root / "pools"
        self.tracking_uri = tracking_uri
        self.sizes = sizes
        self._runtime = runtime
        self.targets = targets
        """A Prometheus file_sd folder: each pool registers its front and members there."""
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        """Per pool: services reconciled at once start its members once."""

    def problem(self, pool: str) -> str | None:
        """Why a service cannot join the pool (None: it can)."""
        return unknown_pool(pool, self.sizes)

    def folder(self, pool: str) -> Path:
        return self.root / pool

    def ensure(self, request: ServingRequest, request_log: str | None) -> ServingState:
        return taken_out(lambda wanted: self._ensure(wanted, request_log), request)

    def _ensure(self, request: ServingRequest, request_log: str | None) -> ServingState:
        pool = request.spec.pool
        folder, name = self.folder(pool), pooled_name(request.ref)
        repository, routes = folder / "repository", folder / "routes"
        routes.mkdir(parents=True, exist_ok=True)
        put_pooled(self.tracking_uri, request.versions[0].model.name, [v.model.version for v in request.versions],
                   request.version("primary").model.version, name, repository, folder)
        config = build_router_config(request, name, "", request_log, ("primary", "canary", "shadow"))
        write_if_changed(routes / f"{name}.json", json.dumps(config, indent=2))
        with self._locks[pool]:
            return self._ensure_running(folder, name, self.sizes[pool], request.by_role())

    def _ensure_running(self, folder: Path, name: str, size: PoolSize, versions: dict[str, str]) -> ServingState:
        """The pool's members and front started (never waited for), and
        whether the front answers each role's version of the service ready."""
        state_path = folder / "state.json"
        state = InstanceState.read(state_path) or InstanceState(ports={}, processes={})
        members = [f"member-{i}" for i in range(size.members)]
        for port in [f"{m}-{p}" for m in members for p in MEMBER_PORTS] + ["front", "front-grpc"]:
            if port not in state.ports:  # never setdefault: its free_port() would burn a port per reconcile
                state.ports[port] = processes.free_port()
        state.write(state_path)
        self._register_targets(folder.name, state, members)
        starting = self._ensure_members(state, state_path, folder, folder / "repository", members, size)
        url = f"http://127.0.0.1:{state.ports['front']}"
        served = dict(url=url, grpc_address=f"127.0.0.1:{state.ports['front-grpc']}")
        roles = dict.fromkeys(versions, False)
        if starting:
            return ServingState(ready=roles, message=starting, **served)
        starting, died = ensure_process(state, state_path, "front", [
            sys.executable, "-m", "kubeloop.front.poolfront", "--config", str(folder / "pool.json"),
            "--port", str(state.ports["front"]), "--grpc-port", str(state.ports["front-grpc"])], folder, {},
            ready=f"{url}/v2/health/live")
        if starting:
            return ServingState(ready=roles, message=starting, failing=died, **served)
        ready, rolled_back, why = pooled_readiness(
            {role: _model_ready(f"{url}/v2/models/{name}/versions/{version}/ready") for role, version in versions.items()})
        message = why or ("" if all(ready.values()) else f"the pool's front is taking up {name}")
        answering = None if ready["primary"] else pooled_answering(
            versions["primary"], [_answering(f"{url}/v2/models/{name}/ready")])
        return ServingState(ready=ready, ready_replicas=1 if ready["primary"] or answering else 0, message=message,
                            rolled_back=rolled_back, answering=answering, **served)

    def _ensure_members(self, state: InstanceState, state_path: Path, folder: Path, repository: Path,
                        members: list[str], size: PoolSize) -> str:
        """Start the members that do not run; what they are doing ("" once all answer)."""
        runtime = self._runtime()
        doing = []
        for member in members:
            argv = runtime.argv(repository, *(state.ports[f"{member}-{p}"] for p in MEMBER_PORTS))
            starting, _ = ensure_process(state, state_path, member, argv, folder, runtime.env(),
                                         ready=f"http://127.0.0.1:{state.ports[f'{member}-http']}/v2/health/live")
            if starting:
                doing.append(starting)
        config = {"name": folder.name, "routes": str(folder / "routes"), "repository": str(repository),
                  "estimate_mib": size.estimate_mib,
                  "spread_at": size.spread_at, "detailed_metrics": size.detailed_metrics,
                  "members": {m: {"url": f"http://127.0.0.1:{state.ports[f'{m}-http']}",
                                  "grpc": f"127.0.0.1:{state.ports[f'{m}-grpc']}",
                                  "pid": state.processes[m]["pid"], "budget_mib": size.memory_mib} for m in members}}
        if write_if_changed(folder / "pool.json", json.dumps(config, indent=2)):
            # A member started again holds nothing: the front, which thinks it
            # holds what it loaded there, starts again too.
            front = state.record("front")
            if front:
                processes.stop(front)
        return "; ".join(doing)

    def _register_targets(self, pool: str, state: InstanceState, members: list[str]) -> None:
        """The front's metrics carry each service's (a rollout's analysis and
        the alerts read them); the members' are Triton's own."""
        if not self.targets:
            return
        targets = [{"targets": [f"127.0.0.1:{state.ports['front']}"], "labels": {"pool": pool, "job": "kubeloop-router"}},
                   *({"targets": [f"127.0.0.1:{state.ports[f'{m}-metrics']}"],
                      "labels": {"pool": pool, "member": m, "job": "triton"}} for m in members)]
        self.targets.mkdir(parents=True, exist_ok=True)
        write_if_changed(self._targets_file(pool), json.dumps(targets))

    def _targets_file(self, pool: str) -> Path:
        return self.targets / f"pool-{pool}.json"

    def delete(self, ref: ObjectRef, pool: str) -> None:
        """The service leaves its pool (the front unloads its model); the
        last to leave stops the pool."""
        folder = self.folder(pool)
        name = pooled_name(ref)
        (folder / "routes" / f"{name}.json").unlink(missing_ok=True)
        remove_pooled(name, folder / "repository", folder)
        with self._locks[pool]:
            if any((folder / "routes").glob("*.json")):
                return
            state = InstanceState.read(folder / "state.json")
            for record in (state.record(n) for n in state.processes) if state else ():
                processes.stop(record)
            if self.targets:
                self._targets_file(pool).unlink(missing_ok=True)
            shutil.rmtree(folder, ignore_errors=True)

    def pools_of(self, ref: ObjectRef) -> list[str]:
        """The pools holding the service's routes (where its spec no longer says)."""
        name = pooled_name(ref)
        return [p.parent.parent.name for p in self.root.glob(f"*/routes/{name}.json")]


def _answering(url: str) -> str | None:
    """The version the front answers the model with now (None: it answers nothing)."""
    try:
        answer = requests.get(url, timeout=2)
    except requests.RequestException:
        return None
    return answer.headers.get("X-Model-Version") if answer.status_code == 200 else None


def _model_ready(url: str) -> tuple[bool, str]:
    """Whether the front answers a version ready; else why, where it says
    (the reason its last load failed)."""
    try:
        answer = requests.get(url, timeout=2)
    except requests.RequestException:
        return False, ""
    if answer.status_code == 200:
        return True, ""
    return False, answer.text if answer.status_code == 503 and answer.text else ""
