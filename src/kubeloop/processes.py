"""Start, find and stop the local platform's background processes.

Each process runs in a session of its own (so it outlives the command that
started it and a terminal's Ctrl-C), logs to a file, and is recorded with its
pid and start time beside its log (NAME.process.json): a pid the kernel has
since reused for something else is never signalled, and whoever removes a
folder can first stop every process started under it (`stop_all_under`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
from tenacity import RetryError, Retrying, retry_if_result, stop_after_delay, wait_fixed


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

    @classmethod
    def read(cls, path: Path) -> "ProcessRecord | None":
        """The record kept at path; None where there is none (or not one)."""
        try:
            return cls(**json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError):
            return None


# prometheus-client's mode, decided here for every process kubeloop starts
# (servers, pipeline workers and, through the workers, their steps): single
# process, with values in memory. Importing feast points these variables at a
# temporary folder of its own, which it deletes when the importing process
# exits normally; a child that inherited them fails on its next metric once
# that process (an operator stopped for a rolling update) is gone.
INHERITED_NOT = ("PROMETHEUS_MULTIPROC_DIR", "PROMETHEUS_MULTIPROCESS_DIR", "prometheus_multiproc_dir")
RECORD_SUFFIX = ".process.json"


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a background process, plus extra."""
    inherited = {k: v for k, v in os.environ.items() if k not in INHERITED_NOT}
    return {**inherited, **(extra or {})}


def single_process_metrics() -> None:
    """Put this process (and what it starts from now on) in prometheus-client's
    single-process mode, whatever an import set before."""
    for name in INHERITED_NOT:
        os.environ.pop(name, None)


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
    record = ProcessRecord(name, proc.pid, psutil.Process(proc.pid).create_time(), str(log_path))
    (log_dir / f"{name}{RECORD_SUFFIX}").write_text(json.dumps(record.to_dict()))
    return record


def stop_all_under(root: Path) -> list[ProcessRecord]:
    """Stop every process `start` recorded under root (at any depth), such as
    the Triton servers, routers and pipeline workers an operator started in
    its work folder; returns the ones that were still running."""
    stopped = []
    for path in sorted(Path(root).rglob(f"*{RECORD_SUFFIX}")):
        record = ProcessRecord.read(path)
        if record is not None and record.running():
            stop(record)
            stopped.append(record)
    return stopped


STOP_TIMEOUT = 10.0  # seconds from SIGTERM to SIGKILL


def stop(record: ProcessRecord, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM the process's whole session, then SIGKILL what is left. A
    session whose first process died (a crash) is still stopped: what that
    process had started (MLflow's server workers) would otherwise run on."""
    if not record.running() and not _session_members(record):
        return
    # start() makes each process the leader of a session and group of its own.
    group = record.pid
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        return
    if _still_there(record, timeout):
        try:
            os.killpg(group, signal.SIGKILL)
        except ProcessLookupError:
            pass
        reap(record.pid)


def _still_there(record: ProcessRecord, timeout: float) -> bool:
    """Whether the record's process or its session outlive timeout seconds
    (the process reaped meanwhile, if it is our child)."""

    def alive() -> bool:
        reap(record.pid)
        return record.running() or bool(_session_members(record))

    try:
        Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(0.1), retry=retry_if_result(bool))(alive)
    except RetryError:
        return True
    return False


def _session_members(record: ProcessRecord) -> list[int]:
    """Live processes in the record's process group. Once its pid belongs to
    another process, so does the group: none of them are the record's."""
    try:
        if abs(psutil.Process(record.pid).create_time() - record.create_time) >= 1.0:
            return []
    except psutil.NoSuchProcess:
        pass
    members = []
    for proc in psutil.process_iter(["create_time"]):
        try:
            if (proc.pid != record.pid and os.getpgid(proc.pid) == record.pid
                    and proc.info["create_time"] >= record.create_time - 1.0
                    and proc.status() != psutil.STATUS_ZOMBIE):
                members.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def wait_exit(record: ProcessRecord, timeout: float) -> int | None:
    """The exit status of a child process started by this process, or None
    if it is still running after timeout seconds."""

    def status() -> tuple[bool, int | None]:
        """(known, exit status): known once it exited, or it is not our child."""
        try:
            pid, code = os.waitpid(record.pid, os.WNOHANG)
        except ChildProcessError:
            return True, (0 if not record.running() else None)
        return (True, os.waitstatus_to_exitcode(code)) if pid else (False, None)

    try:
        return Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(0.2),
                        retry=retry_if_result(lambda answer: not answer[0]))(status)[1]
    except RetryError:
        return None


def reap(pid: int) -> None:
    """Collect the exit status if the process is our own child."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LISTEN_FLOOR = 10000
_NODE_PORTS_START = 30000  # Kubernetes' default NodePort range starts here
# The API server's static band of that range (30000-32767): min(max(16, 2768 / 32), 128) ports.
_NODE_PORTS_STATIC_BAND = 86
_handed_out: set[int] = set()
# Ports handed out by any process of this user on this machine, until each
# reservation ends: two pytest workers starting platforms at once drew the
# same port, and the second server could not bind it (SeaweedFS's S3 gRPC).
_RESERVATIONS = Path(tempfile.gettempdir()) / f"kubeloop-ports-{os.getuid()}.json"
# Long enough for the slowest server to bind its port (it is then taken, and
# never handed out again while bound); the file holds at most this long's ports.
RESERVATION_SECONDS = 600.0


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(node_port: bool = False) -> int:
    """A TCP port on 127.0.0.1 that is free right now, for a server to bind.

    Chosen below the kernel's ephemeral range: a port the kernel hands out
    itself (bind to 0) can be taken by any outgoing connection in the seconds
    before the server binds it, which failed a CI run (mlflow: address already
    in use), and below Kubernetes' NodePort range. A port is never handed
    out twice by this process, nor by another on this machine while its
    reservation lasts (RESERVATION_SECONDS).

    node_port: one of the NodePort range's first ports instead, the band the
    API server keeps for Services that name their nodePort (it assigns the
    rest first), for a server a NodePort Service may take over on loopback.
    """
    floor, ceiling = _LISTEN_FLOOR, min(_ephemeral_start(), _NODE_PORTS_START)
    if node_port:
        floor, ceiling = _NODE_PORTS_START, _NODE_PORTS_START + _NODE_PORTS_STATIC_BAND
    rng = random.Random()
    with _reserved() as reserved:
        for _ in range(200):
            port = rng.randrange(floor, ceiling)
            if port in _handed_out or port in reserved:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            reserved[port] = time.time() + RESERVATION_SECONDS
            return port
    raise RuntimeError(f"no free port between {floor} and {ceiling} after 200 tries")


@contextlib.contextmanager
def _reserved() -> Iterator[dict[int, float]]:
    """The machine's port reservations still in force (port -> end), under
    an exclusive lock; what the caller adds is written back. Where no file
    can be written (a read-only root), this process's own ports only."""
    try:
        file = open(_RESERVATIONS, "a+", encoding="utf-8")  # noqa: SIM115 - closed below, after the write
    except OSError:
        yield {}
        return
    with file:
        fcntl.flock(file, fcntl.LOCK_EX)
        file.seek(0)
        try:
            held = {int(port): end for port, end in json.loads(file.read() or "{}").items()}
        except (ValueError, AttributeError):
            held = {}  # a file cut short by a killed writer holds nothing worth keeping
        now = time.time()
        reserved = {port: end for port, end in held.items() if end > now}
        yield reserved
        file.seek(0)
        file.truncate()
        file.write(json.dumps(reserved))


def log_tail(path: str | Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
