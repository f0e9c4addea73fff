"""Serving on this machine: a real tritonserver per InferenceService, with
the registered versions in its model repository, and the router in front.

Everything an InferenceService runs is recorded in its folder (ports,
processes, what Triton has loaded), so a restarted operator adopts the
processes it started before instead of starting them twice. Versions move
through Triton's repository API: the config's version policy is rewritten and
the model reloaded, which loads new versions before unloading old ones.

`ensure` never waits for a process to come up or a model to load: it
starts the process or the load, reports it as starting or loading and returns
(the reconciler comes back soon), so a kopf worker is never held, with the
object's lock, for as long as Triton takes to start or to load a model.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
from functools import partial
from pathlib import Path

import requests

from kubeloop.api.refs import ObjectRef
from kubeloop import processes
from kubeloop.files import write_if_changed
from kubeloop.serving.instances import InstanceState, answers, ensure_process
from kubeloop.serving.base import PoolSize, ServingBackend, ServingRequest, ServingState, ServingUnavailable, triton_name
from kubeloop.serving.loads import Loads
from kubeloop.serving.pools import LocalPools
from kubeloop.serving.repository import fetch_version, prune_versions, write_config
from kubeloop.serving.routes import build_router_config
from kubeloop.serving.runtime import TritonRuntime

LOAD_TIMEOUT = 600.0
"""How long a load may take before it is asked for again (it runs beside the reconcile)."""
PORTS = ("http", "grpc", "metrics", "router", "router-grpc")
"""An instance's ports: tritonserver's (HTTP, gRPC, metrics) and the router's (HTTP, gRPC)."""
log = logging.getLogger(__name__)


class LocalServing(ServingBackend):
    name = "local"
    reads_online_features = True

    def __init__(self, work_dir: Path, tracking_uri: str, runtime: TritonRuntime | None = None,
                 log_root: str | None = None, targets: Path | None = None, pools: dict[str, PoolSize] | None = None):
        self.root = Path(work_dir) / "serving"
        self.pools = LocalPools(self.root, tracking_uri, pools or {}, lambda: self.runtime, targets)
        self.tracking_uri = tracking_uri
        self._runtime = runtime
        self.log_root = log_root
        """Request logs go below it: a folder or an s3:// prefix."""
        self.targets = targets
        """A Prometheus file_sd folder: each router and tritonserver registers its metrics there."""
        self._loads = Loads()

    @property
    def runtime(self) -> TritonRuntime:
        if self._runtime is None:
            self._runtime = TritonRuntime.discover()
        return self._runtime

    def folder(self, ref: ObjectRef) -> Path:
        return self.root / f"{ref.namespace}-{ref.name}"

    def pool_problem(self, pool: str) -> str | None:
        return self.pools.problem(pool)

    def ensure(self, request: ServingRequest) -> ServingState:
        pool = request.spec.pool
        for joined in self.pools.pools_of(request.ref):
            if joined != pool:
                self.pools.delete(request.ref, joined)
        if pool:
            self._stop_dedicated(request.ref)
            return self.pools.ensure(request, self.request_log(request.ref, request.spec))
        return self._ensure_dedicated(request)

    def _ensure_dedicated(self, request: ServingRequest) -> ServingState:
        folder = self.folder(request.ref)
        folder.mkdir(parents=True, exist_ok=True)
        state_path = folder / "state.json"
        state = InstanceState.read(state_path) or InstanceState(ports={}, processes={})
        # Every port of a new instance; the router's gRPC port of one from before the front served gRPC.
        for missing in set(PORTS) - set(state.ports):
            state.ports[missing] = processes.free_port()
        repository = folder / "repository"
        model = request.versions[0].model.name
        name = triton_name(model)
        wanted = request.by_role()
        self._fetch(repository, model, folder, set(wanted.values()))
        primary = wanted["primary"]
        config_text = (folder / "configs" / f"{primary}.pbtxt").read_text()
        fingerprint = hashlib.sha256((config_text + json.dumps(sorted(set(wanted.values())))).encode()).hexdigest()
        triton = f"http://127.0.0.1:{state.ports['http']}"
        router_port = state.ports["router"]
        url = f"http://127.0.0.1:{router_port}"
        served = partial(ServingState, url=url, grpc_address=f"127.0.0.1:{state.ports['router-grpc']}")
        starting, died = ensure_process(state, state_path, "tritonserver", self.runtime.argv(
            repository, state.ports["http"], state.ports["grpc"], state.ports["metrics"]), folder, self.runtime.env(),
            ready=f"{triton}/v2/health/live")
        if starting:
            state.loaded = state.answering = ""  # a new server has nothing loaded
            state.write(state_path)
            return served(ready={role: False for role in wanted}, message=starting, failing=died)
        if state.loaded != fingerprint:
            loading = self._ensure_loaded(state, folder, name, primary, sorted(set(wanted.values())), triton,
                                          fingerprint)
            if loading:
                # Triton loads new versions before it unloads old ones: the router keeps answering.
                router = state.record("router")
                answering = state.answering if router and router.running() else None
                return served(ready={role: False for role in wanted}, answering=answering,
                              ready_replicas=1 if answering else 0, message=f"Triton is loading {model} version {primary}")
            state.loaded = fingerprint
            state.write(state_path)
        index = self._index(triton)
        failed = {v: index.get(v, {}).get("reason", "") for v in set(wanted.values())
                  if index.get(v, {}).get("state") == "UNAVAILABLE"}
        if failed.get(primary):
            raise ServingUnavailable(f"Triton cannot load {model} version {primary}: {failed[primary]}")
        rolled_back = tuple(role for role, v in wanted.items() if role != "primary" and v in failed)
        ready = {role: self._version_ready(triton, name, v) for role, v in wanted.items() if role not in rolled_back}
        self._write_routes(folder, request, name, triton, [r for r in wanted if r not in rolled_back])
        starting, died = ensure_process(state, state_path, "router", [
            sys.executable, "-m", "kubeloop.front.router", "--config", str(folder / "router.json"),
            "--port", str(router_port), "--grpc-port", str(state.ports["router-grpc"])], folder, {},
            ready=f"{url}/v2/health/live")
        self._register_targets(request.ref, state)
        if starting:
            return served(ready={role: False for role in ready}, message=starting, failing=died)
        message = "; ".join(f"{role} version {wanted[role]} failed to load and was rolled back: {failed[wanted[role]]}"
                            for role in rolled_back)
        if not ready.get("primary"):
            message = message or f"Triton is loading {model} version {primary}"
        elif not answers(f"{url}/v2/health/ready"):
            # The router answers entity requests only once its feature stores are open.
            ready["primary"] = False
            message = message or "the router is opening the feature store"
        elif state.answering != primary:
            state.answering = primary
            state.write(state_path)
        return served(ready=ready, ready_replicas=1 if ready.get("primary") else 0, message=message,
                      rolled_back=rolled_back)

    def request_log(self, ref: ObjectRef, spec) -> str | None:  # noqa: ANN001 - InferenceServiceSpec
        if not spec.request_logging.enabled:
            return None
        return spec.request_logging.destination or self._default_log(ref)

    def _default_log(self, ref: ObjectRef) -> str:
        if self.log_root:
            return f"{self.log_root.rstrip('/')}/{ref.namespace}-{ref.name}"
        return str(self.folder(ref) / "requests")

    def _register_targets(self, ref: ObjectRef, state: InstanceState) -> None:
        if not self.targets:
            return
        labels = {"namespace": ref.namespace, "inferenceservice": ref.name}
        targets = [{"targets": [f"127.0.0.1:{state.ports['router']}"], "labels": {**labels, "job": "kubeloop-router"}},
                   {"targets": [f"127.0.0.1:{state.ports['metrics']}"], "labels": {**labels, "job": "triton"}}]
        path = self.targets / f"serving-{ref.namespace}-{ref.name}.json"
        self.targets.mkdir(parents=True, exist_ok=True)
        write_if_changed(path, json.dumps(targets))

    def delete(self, ref: ObjectRef) -> None:
        for pool in self.pools.pools_of(ref):
            self.pools.delete(ref, pool)
        self._stop_dedicated(ref)

    def _stop_dedicated(self, ref: ObjectRef) -> None:
        if self.targets:
            (self.targets / f"serving-{ref.namespace}-{ref.name}.json").unlink(missing_ok=True)
        folder = self.folder(ref)
        self._loads.forget(folder.name)
        state = InstanceState.read(folder / "state.json")
        if state:
            for name in ("router", "tritonserver"):
                record = state.record(name)
                if record:
                    processes.stop(record)
        shutil.rmtree(folder, ignore_errors=True)

    # -- steps ---------------------------------------------------------------

    def _fetch(self, repository: Path, model: str, folder: Path, versions: set[str]) -> None:
        configs = folder / "configs"
        configs.mkdir(exist_ok=True)
        for version in sorted(versions):
            # Pruning removes a version's folder but keeps its config: a version
            # served again (an alias moved back) is fetched again.
            fetched = (repository / triton_name(model) / version).is_dir()
            if not (fetched and (configs / f"{version}.pbtxt").exists()):
                from google.protobuf import text_format

                config = fetch_version(self.tracking_uri, model, version, repository, backend="python")
                (configs / f"{version}.pbtxt").write_text(text_format.MessageToString(config))

    def _ensure_loaded(self, state: InstanceState, folder: Path, name: str, primary: str, versions: list[str],
                       triton: str, fingerprint: str) -> bool:
        """Start loading what the fingerprint names unless that load runs; True
        while it runs, False once it finished (raising what it failed with)."""
        key = folder.name
        token = f"{state.processes['tritonserver']['pid']}:{fingerprint}"
        load = self._loads.get(key)
        if load is None or (load.token != token and load.done()):
            # Only between loads: a running one reads the repository this rewrites.
            self._write_repository(folder / "repository", folder, name, primary, versions)
            load = self._loads.start(key, token, lambda: _load(triton, name))
        if load.token != token or not load.done():
            return True
        self._loads.collect(key, load)
        return False

    def _write_repository(self, repository: Path, folder: Path, name: str, primary: str, versions: list[str]) -> None:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2 as mc

        config = text_format.Parse((folder / "configs" / f"{primary}.pbtxt").read_text(), mc.ModelConfig())
        write_config(repository, config, versions)
        prune_versions(repository, name, versions)

    def _index(self, triton: str) -> dict[str, dict]:
        """Version -> {state, reason} from Triton's repository index."""
        try:
            entries = requests.post(f"{triton}/v2/repository/index", json={}, timeout=10).json()
        except (requests.RequestException, ValueError) as exc:
            raise ServingUnavailable(f"Triton's repository index: {exc}") from exc
        return {str(e.get("version")): e for e in entries if e.get("version")}

    def _version_ready(self, triton: str, name: str, version: str) -> bool:
        return answers(f"{triton}/v2/models/{name}/versions/{version}/ready")

    def _write_routes(self, folder: Path, request: ServingRequest, name: str, triton: str, roles: list[str]) -> None:
        config = build_router_config(request, name, triton, self.request_log(request.ref, request.spec), roles)
        write_if_changed(folder / "router.json", json.dumps(config, indent=2))


def _load(triton: str, name: str) -> None:
    """Ask Triton to (re)load the model; it answers once the load is over."""
    try:
        response = requests.post(f"{triton}/v2/repository/models/{name}/load", timeout=LOAD_TIMEOUT)
    except requests.RequestException as exc:
        raise ServingUnavailable(f"Triton's repository API: {exc}") from exc
    if response.status_code >= 500:
        raise ServingUnavailable(f"Triton could not load {name}: {response.text}")
