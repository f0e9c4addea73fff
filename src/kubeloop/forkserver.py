"""A warm interpreter for the local platform's short Python processes.

Every pipeline step and monitoring job on the local backend used to be a
fresh `python -m ...` that spent most of its CPU importing torch, MLflow,
Feast and Evidently (Feast alone about 7 s, most of it typeguard
instrumenting its classes). The fork server imports those libraries once and
forks a child per process instead: the child gets the caller's stdin, stdout
and stderr, working folder, environment and arguments, runs the module as
`python -m` would, and its exit status goes back to the caller.

The caller is `kubeloop-python`, which takes `python -m module args...` and
behaves like it: where $KUBELOOP_FORKSERVER_SOCKET names no reachable server (or the
server never started the child), it execs the plain interpreter instead, so
nothing depends on the server being there. kubeloop's own modules are not
preloaded: an edited module is what the next child imports.

    python -m kubeloop.forkserver SOCKET MODULE...    # serve, preloading MODULEs
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import sysconfig
import traceback
import warnings
from pathlib import Path

from kubeloop import processes
from kubeloop.polling import wait_for

ENV = "KUBELOOP_FORKSERVER_SOCKET"
CLIENT = "kubeloop-python"
STARTED = b"S"
STATUS = struct.Struct("!i")
HEADER = struct.Struct("!Q")
# What the local backend's steps and monitoring jobs import that is slow to
# import; prometheus-client first, so that its values stay in this process's
# memory whatever Feast's import sets.
PRELOAD = ("prometheus_client", "kfp.dsl.executor_main", "numpy", "pandas", "pyarrow", "torch", "sklearn",
           "onnx", "onnxruntime", "boto3", "mlflow", "feast", "evidently")
PR_SET_PDEATHSIG = 1
BIND_TIMEOUT = 10.0
REQUEST_TIMEOUT = 10.0
MAX_REQUEST = 16 << 20  # arguments and environment, as JSON
MAX_LOGGED_EXITS = 100_000  # a line each, about 6 MB of log
IDLE_ENV = "KUBELOOP_FORKSERVER_IDLE_SECONDS"
IDLE_SECONDS = 600.0
"""A server with nothing to run for this long exits (the memory of its
preloaded libraries, about 1 GiB, goes back); the next caller starts cold
and the next ensure() starts another."""


# The caller's side (kubeloop-python), which starts every step: it imports
# none of the libraries the server preloads.

def main() -> None:
    args = sys.argv[1:]
    path = os.environ.get(ENV)
    if path and len(args) >= 2 and args[0] == "-m":
        code = _run_in_server(path, args)
        if code is not None:
            sys.exit(code)
    os.execv(sys.executable, [sys.executable, *args])


def _run_in_server(path: str, args: list[str]) -> int | None:
    """The child's exit status; None where the server did not start it."""
    request = json.dumps({"argv": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        socket.send_fds(conn, [HEADER.pack(len(request))], _standard_fds())
        conn.sendall(request)
        if conn.recv(1) != STARTED:
            return None
    except OSError:
        return None
    status = _recv_exactly(conn, STATUS.size)
    if status is None:
        print(f"kubeloop-python: the fork server at {path} went away while running {args[1]}", file=sys.stderr)
        return 1
    return STATUS.unpack(status)[0]


def _standard_fds() -> list[int]:
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def _recv_exactly(conn: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def client_executable() -> str | None:
    """kubeloop-python, where this process was told of a fork server and the
    script is installed beside this interpreter's others."""
    path = _client_path()
    return str(path) if os.environ.get(ENV) and path.exists() else None


# The server's side.

def serve(path: str, preload: list[str]) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    # Whoever can connect runs code as this user: the owner alone may.
    umask = os.umask(0o177)
    listener.bind(path)
    os.umask(umask)
    listener.listen(64)
    # Callers that connect meanwhile wait in the backlog.
    _preload(preload)
    Server(listener, idle=float(os.environ.get(IDLE_ENV, IDLE_SECONDS))).run()


def _preload(modules: list[str]) -> None:
    processes.single_process_metrics()
    os.environ["_KFP_RUNTIME"] = "true"  # what kfp's runtime imports, as its steps see it
    for name in modules:
        try:
            with warnings.catch_warnings():  # the libraries' deprecations: news for their users, not ours
                warnings.simplefilter("ignore")
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a child that needs it imports it itself, and fails there
            print(f"fork server: not preloaded: {name}", file=sys.stderr)
    os.environ.pop("_KFP_RUNTIME")


class ExitLog:
    """A line per child on stdout (the server's log), up to limit lines."""

    def __init__(self, limit: int):
        self.limit, self.count = limit, 0

    def record(self, line: str) -> None:
        self.count += 1
        if self.count <= self.limit:
            print(line, flush=True)
        elif self.count == self.limit + 1:
            print(f"{self.limit} exits logged: the later ones are not", flush=True)


class Server:
    def __init__(self, listener: socket.socket, idle: float):
        self.listener, self.idle = listener, idle
        self.pid = os.getpid()
        self.exits = ExitLog(MAX_LOGGED_EXITS)
        self.children: dict[int, tuple[socket.socket, str]] = {}
        """pid -> the caller's connection and the module the child runs"""
        self.selector = selectors.DefaultSelector()
        self.wakeup_r, self.wakeup_w = socket.socketpair()
        self.wakeup_w.setblocking(False)
        signal.set_wakeup_fd(self.wakeup_w.fileno())
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._stop)
        self.selector.register(listener, selectors.EVENT_READ, self._accept)
        self.selector.register(self.wakeup_r, selectors.EVENT_READ, self._reap)

    def run(self) -> None:
        while True:
            events = self.selector.select(timeout=self.idle)
            if not events and not self.children:
                print(f"idle for {self.idle:g} s: exiting", flush=True)
                return
            for key, _ in events:
                try:
                    key.data(key.fileobj)
                except Exception:  # noqa: BLE001 - the server going down would take every running child with it
                    traceback.print_exc()

    def _accept(self, listener: socket.socket) -> None:
        conn, _ = listener.accept()
        request, fds = self._request(conn)
        if request is None:
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            conn.close()
            self._child(request, fds)
        for fd in fds:
            os.close(fd)
        self.children[pid] = (conn, request["argv"][1])
        self.selector.register(conn, selectors.EVENT_READ, self._caller_gone)
        with contextlib.suppress(OSError):
            conn.sendall(STARTED)

    @staticmethod
    def _request(conn: socket.socket) -> tuple[dict | None, list[int]]:
        """What kubeloop-python asks (None from anything else) and its three standard streams."""
        fds: list[int] = []
        conn.settimeout(REQUEST_TIMEOUT)  # a caller that connects and says nothing must not stall the others
        try:
            header, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
            size = HEADER.unpack(header)[0]
            request = json.loads(_recv_exactly(conn, size) or b"") if size <= MAX_REQUEST else {}
            if len(fds) == 3 and request["argv"][0] == "-m":
                conn.settimeout(None)
                return request, fds
        except (OSError, ValueError, KeyError, IndexError, TypeError, struct.error):
            pass
        for fd in fds:
            os.close(fd)
        return None, []

    def _caller_gone(self, conn: socket.socket) -> None:
        """The caller exited or was killed (a run cancelled, a job stopped):
        so is its child, as if it had been the caller's own process."""
        with contextlib.suppress(OSError):
            if conn.recv(1):
                return
        self.selector.unregister(conn)
        for pid, (known, _) in self.children.items():
            if known is conn:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _reap(self, wakeup: socket.socket) -> None:
        with contextlib.suppress(BlockingIOError):
            wakeup.recv(4096)
        for pid in list(self.children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self._finished(pid, os.waitstatus_to_exitcode(status))

    def _finished(self, pid: int, code: int) -> None:
        conn, module = self.children.pop(pid)
        code = code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it
        self.exits.record(f"{module} (pid {pid}) exited with {code}")
        with contextlib.suppress(OSError):
            conn.sendall(STATUS.pack(code))
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(conn)
        conn.close()

    def _stop(self, *_) -> None:
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        sys.exit(0)

    def _child(self, request: dict, fds: list[int]) -> None:
        try:
            self._detach(fds)
            code = _run_module(request)
        except BaseException:  # noqa: BLE001 - a child never returns into the server's loop
            traceback.print_exc()
            code = 1
        _exit(code)

    def _detach(self, fds: list[int]) -> None:
        """Leave the server's sockets and signal handling behind; take the
        caller's standard streams."""
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        self.selector.close()
        for conn in (self.listener, self.wakeup_r, self.wakeup_w, *(c for c, _ in self.children.values())):
            conn.close()
        _die_with_server(self.pid)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)


def _die_with_server(server: int) -> None:
    """A child whose server is killed is killed too: its caller can no
    longer learn how it ended, and must not see it go on running."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server:  # killed before the line above
        os._exit(1)


def _run_module(request: dict) -> int:
    """Run `python -m MODULE ARGS...` here, as the caller asked; its exit status."""
    import runpy

    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = request["cwd"]
    _reseed()
    module, args = request["argv"][1], request["argv"][2:]
    sys.argv = [module, *args]
    sys.stdout.reconfigure(line_buffering=True)
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        return _exit_code(exit_.code)
    return 0


def _reseed() -> None:
    """Each child draws its own random numbers, as a fresh interpreter would
    (Python's own generator is reseeded by the fork itself)."""
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _exit(code: int) -> None:
    """End the child as an interpreter's exit would (atexit handlers, such as
    MLflow ending its active run, and flushed streams), without unwinding into
    the server's loop."""
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


# Starting the platform's server.

def python(home: Path | None) -> tuple[str, dict[str, str]]:
    """The interpreter to start `-m MODULE` with, and what to add to its
    environment: kubeloop-python and home's fork server where home is given,
    else this interpreter."""
    env = ensure(home) if home is not None else {}
    return (str(_client_path()), env) if env else (sys.executable, {})


def _client_path() -> Path:
    return Path(sysconfig.get_path("scripts")) / CLIENT


def ensure(home: Path, preload: tuple[str, ...] = PRELOAD, idle: float = IDLE_SECONDS) -> dict[str, str]:
    """The environment that sends kubeloop-python to home's fork server (a
    platform's state dir or an operator's work dir), started here (importing
    preload) unless it runs already; {} where kubeloop-python is not
    installed (the processes then start cold)."""
    if not _client_path().exists():
        return {}
    folder = Path(home) / "forkserver"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / "server.sock"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _running(folder):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # a dead server's
            processes.start("server", [sys.executable, "-m", "kubeloop.forkserver", str(path), *preload], folder,
                            env={"PYTHONUNBUFFERED": "1", IDLE_ENV: str(idle)})
            # Listening comes before preloading: callers from here on queue for a warm start.
            try:
                wait_for(path.exists, timeout=BIND_TIMEOUT, interval=0.05)
            except TimeoutError:
                return {}
    return {ENV: str(path)}


def _running(folder: Path) -> bool:
    record = processes.ProcessRecord.read(folder / f"server{processes.RECORD_SUFFIX}")
    return record is not None and record.running()


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2:])
