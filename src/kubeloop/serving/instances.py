"""What the local backend runs for a served object (an InferenceService's
Triton and router, a pool's members and front): the processes, recorded
with their ports in the object's folder, so a restarted operator adopts the
processes it started before instead of starting them twice."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import requests

from kubeloop import processes
from kubeloop.files import write_atomic
from kubeloop.serving.base import ServingUnavailable

READY_TIMEOUT = 60.0
"""How long a started process may take to answer before it counts as failed."""
log = logging.getLogger(__name__)


@dataclass
class InstanceState:
    """What runs for one served object: its ports and processes, and what its Triton loaded."""

    ports: dict[str, int]
    processes: dict[str, dict]
    loaded: str = ""
    """Fingerprint of the config and versions Triton last loaded."""
    failed: dict[str, str] | None = None
    """Versions Triton could not load, with its reason."""
    answering: str = ""
    """The primary version the router last sent callers to with Triton ready."""

    @classmethod
    def read(cls, path: Path) -> "InstanceState | None":
        try:
            return cls(**json.loads(path.read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None

    def write(self, path: Path) -> None:
        write_atomic(path, json.dumps(self.__dict__, indent=2))

    def record(self, name: str) -> processes.ProcessRecord | None:
        data = self.processes.get(name)
        return processes.ProcessRecord(**data) if data else None


def ensure_process(state: InstanceState, state_path: Path, name: str, argv: list[str], folder: Path,
                   env: dict[str, str], ready: str) -> tuple[str, bool]:
    """Start the process unless it runs; "" when it answers at `ready`, else
    what it is doing (it is never waited for here). Also whether it had
    died: an outage, which no hysteresis may hide."""
    record = state.record(name)
    restarted = ""
    if record is None or not record.running():
        if record is not None:
            restarted = f"{name} (pid {record.pid}) was not running: restarted it. "
            log.warning("%s of %s", restarted.strip(), folder.name)
        record = processes.start(name, argv, folder / "logs", env=env, cwd=folder)
        state.processes[name] = record.to_dict()
        state.write(state_path)
    if answers(ready):
        return "", False
    if not record.running():
        raise ServingUnavailable(f"{name} exited:\n{processes.log_tail(record.log)}")
    age = time.time() - record.create_time
    if age > READY_TIMEOUT:
        raise ServingUnavailable(f"{name} (pid {record.pid}) not ready {age:.0f} s after it started:\n"
                                 f"{processes.log_tail(record.log)}")
    return f"{restarted}{name} is starting (pid {record.pid})", bool(restarted)


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
