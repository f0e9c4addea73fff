"""Start, find and stop the local platform's background processes.

Each process runs in a session of its own (so it outlives the command that
started it and a terminal's Ctrl-C), logs to a file, and is recorded with its
pid and start time: a pid the kernel has since reused for something else is
never signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil


@dataclass(frozen=True)
class ProcessRecord:
    """A started process, as kept in the platform's state file."""

    name: str
    pid: int
    create_time: float
    log: str

    def running(self) -> bool:
        try:
            proc = psutil.Process(self.pid)
            return (abs(proc.create_time() - self.create_time) < 1.0
                    and proc.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def to_dict(self) -> dict:
        return asdict(self)


# Importing feast points these at a temporary folder of its own, which it
# deletes when the importing process exits. A server started from such a
# process would keep its prometheus-client values there and fail on the first
# new label set once the folder is gone (servers outlive operator restarts).
INHERITED_NOT = ("PROMETHEUS_MULTIPROC_DIR", "PROMETHEUS_MULTIPROCESS_DIR", "prometheus_multiproc_dir")


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a background server, plus extra."""
    inherited = {k: v for k, v in os.environ.items() if k not in INHERITED_NOT}
    return {**inherited, **(extra or {})}


def start(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None,
          cwd: Path | None = None) -> ProcessRecord:
    """Start argv in the background, logging to log_dir/name.log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env(env), cwd=cwd, start_new_session=True,
        )
    return ProcessRecord(name, proc.pid, psutil.Process(proc.pid).create_time(), str(log_path))


def stop(record: ProcessRecord, timeout: float = 10.0) -> None:
    """SIGTERM the process's whole session, then SIGKILL what is left."""
    if not record.running():
        return
    try:
        group = os.getpgid(record.pid)
    except ProcessLookupError:
        return
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and record.running():
        reap(record.pid)
        time.sleep(0.1)
    if record.running():
        os.killpg(group, signal.SIGKILL)
        reap(record.pid)


def wait_exit(record: ProcessRecord, timeout: float) -> int | None:
    """The exit status of a child process started by this process, or None
    if it is still running after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            pid, status = os.waitpid(record.pid, os.WNOHANG)
        except ChildProcessError:
            return 0 if not record.running() else None
        if pid:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)


def reap(pid: int) -> None:
    """Collect the exit status if the process is our own child."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: str | Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
