"""The local backend: kfp's local runner in a worker process per run.

Each run lives in a folder named after the run: the request, the worker's
log and its state file. The worker is started in a session of its own, so
it outlives an operator restart; the restarted operator finds the run by its
name (the same request always gets the same name) and keeps following it
instead of starting it again.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from kubeloop import forkserver, processes
from kubeloop.files import write_atomic
from kubeloop.pipelines.backends.base import PipelineBackend, RunRequest, RunStatus


@dataclass(frozen=True)
class LocalContext:
    """What pipelines need that the operator's machine provides."""

    feast_repo: str
    tracking_uri: str
    git_sha: str = "unknown"


# Steps write to MLflow for minutes; an MLflow restart meanwhile must cost a
# retry, not the run. The operator's own client gives up within seconds
# (kubeloop.registry.mlflow.fail_fast) and its settings are not the steps'.
STEP_MLFLOW_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "8", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "2",
                       "MLFLOW_HTTP_REQUEST_TIMEOUT": "120"}


def read_state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def write_state(run_dir: Path, **fields) -> dict:
    """Merge fields into the run's state file, atomically."""
    state = {**read_state(run_dir), **fields, "updated": time.time()}
    write_atomic(run_dir / "state.json", json.dumps(state, indent=2, default=str))
    return state


def _alive(state: dict) -> bool:
    try:
        proc = psutil.Process(state["pid"])
        return abs(proc.create_time() - state["create_time"]) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
    except (KeyError, psutil.Error):
        return False


class LocalBackend(PipelineBackend):
    name = "local"

    def __init__(self, work_dir: Path, context: LocalContext, worker: str = "kubeloop.pipelines.worker",
                 tensorrt: bool = False, forkserver: Path | None = None):
        """tensorrt: whether this machine's Python has TensorRT for the optimiser;
        forkserver: the folder whose fork server starts the steps (None: each
        step a fresh interpreter)."""
        self.runs = Path(work_dir) / "runs"
        self.forkserver = forkserver
        self.context = context
        self.worker = worker
        self.tensorrt = tensorrt

    def run_dir(self, run_id: str) -> Path:
        return self.runs / run_id

    def submit(self, request: RunRequest) -> RunStatus:
        run_dir = self.run_dir(request.name)
        self.runs.mkdir(parents=True, exist_ok=True)
        try:
            run_dir.mkdir()
        except FileExistsError:
            return self.status(request.name) or self._broken(request.name)
        arguments = {**request.arguments, **asdict(self.context), "pipeline_run": request.name}
        (run_dir / "request.json").write_text(json.dumps(
            {"name": request.name, "pipeline": request.pipeline, "arguments": arguments,
             "labels": request.labels}, indent=2, default=str))
        write_state(run_dir, phase="Pending", progress="starting the worker")
        # In a session of its own, recorded where `kubeloop dev down` finds it, and
        # with prometheus-client's mode decided by kubeloop, not by what the operator imported.
        warm = forkserver.ensure(self.forkserver) if self.forkserver else {}
        worker = processes.start("worker", [sys.executable, "-m", self.worker, str(run_dir)], run_dir,
                                 env={"PYTHONUNBUFFERED": "1", **STEP_MLFLOW_RETRIES, **warm})
        write_state(run_dir, pid=worker.pid, create_time=worker.create_time)
        return self.status(request.name)

    def status(self, run_id: str) -> RunStatus | None:
        run_dir = self.run_dir(run_id)
        if not (run_dir / "request.json").exists():
            return None
        state = read_state(run_dir)
        phase = state.get("phase", "Pending")
        if phase in ("Pending", "Running") and "pid" in state and not _alive(state):
            # The state may have been written between our read and the check.
            state = read_state(run_dir)
            if state.get("phase") in ("Pending", "Running"):
                state = write_state(run_dir, phase="Failed",
                                    error=f"the worker process exited unexpectedly; see {run_dir / 'worker.log'}")
            phase = state["phase"]
        return RunStatus(run_id=run_id, phase=phase, url=f"file://{run_dir}", outputs=state.get("outputs", {}),
                         error=state.get("error"), progress=state.get("progress"))

    def cancel(self, run_id: str) -> None:
        run_dir = self.run_dir(run_id)
        state = read_state(run_dir)
        if state.get("phase") in ("Pending", "Running") and _alive(state):
            os.killpg(os.getpgid(state["pid"]), signal.SIGTERM)
            write_state(run_dir, phase="Failed", error="cancelled")

    def _broken(self, run_id: str) -> RunStatus:
        return RunStatus(run_id=run_id, phase="Failed",
                         error=f"run folder {self.run_dir(run_id)} exists without a request; remove it to retry")
