"""The fork server and kubeloop-python, as real processes (no platform):
what a module run through them sees and returns is what `python -m` gives,
and a caller, child or server that dies takes the right ones with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from kubeloop import forkserver, processes
from tests.support.waiting import wait_for

CLIENT = forkserver._client_path()
PROBE = textwrap.dedent("""
    import json, os, sys
    print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "colour": os.environ.get("COLOUR"),
                      "stdin": sys.stdin.read(), "pid": os.getpid(),
                      "preloaded": "json" in sys.modules and "tomllib" in sys.modules}))
    print("to stderr", file=sys.stderr)
    if len(sys.argv) > 1 and sys.argv[1] == "fail":
        raise RuntimeError("the probe failed")
    if len(sys.argv) > 1 and sys.argv[1] == "sleep":
        open(os.environ["PIDFILE"], "w").write(str(os.getpid()))
        import time; time.sleep(120)
    sys.exit(int(os.environ.get("CODE", "0")))
""")

pytestmark = pytest.mark.skipif(not CLIENT.exists(), reason="kubeloop-python is installed by `make setup`")


@pytest.fixture
def probe_dir(tmp_path):
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "probe.py").write_text(PROBE)
    return folder


@pytest.fixture
def server(tmp_path):
    """A fork server of tmp_path/state preloading tomllib (which the probe never imports)."""
    env = forkserver.ensure(tmp_path / "state", preload=("tomllib",))
    yield env
    processes.stop_all_under(tmp_path / "state")


def run(probe_dir: Path, env: dict[str, str], *args: str, stdin: str = "", extra: dict | None = None):
    full = {**os.environ, **env, "PYTHONPATH": str(probe_dir), "COLOUR": "teal", **(extra or {})}
    return subprocess.run([str(CLIENT), "-m", "probe", *args], input=stdin, capture_output=True, text=True,
                          env=full, cwd=probe_dir, timeout=60)


def served(tmp_path: Path) -> str:
    return (tmp_path / "state" / "forkserver" / "server.log").read_text()


def test_a_module_run_warm_sees_and_returns_what_python_m_gives(probe_dir, server, tmp_path):
    warm = wait_for(lambda: (r := run(probe_dir, server, "a", "b c", stdin="hello")) and "exited with 0" in served(
        tmp_path) and r, timeout=60)
    seen = json.loads(warm.stdout)
    assert seen["argv"] == ["a", "b c"] and seen["cwd"] == str(probe_dir) and seen["colour"] == "teal"
    assert seen["stdin"] == "hello" and warm.stderr == "to stderr\n" and warm.returncode == 0
    assert seen["preloaded"], "the child should have the server's preloaded modules"
    assert run(probe_dir, server, extra={"CODE": "3"}).returncode == 3
    failed = run(probe_dir, server, "fail")
    assert failed.returncode == 1 and "RuntimeError: the probe failed" in failed.stderr
    assert "probe (pid" in served(tmp_path) and "exited with 3" in served(tmp_path)


def test_without_a_server_the_module_runs_cold_with_the_same_answers(probe_dir, tmp_path):
    env = {forkserver.ENV: str(tmp_path / "no-server.sock")}
    cold = run(probe_dir, env, "a", stdin="hi", extra={"CODE": "4"})
    seen = json.loads(cold.stdout)
    assert cold.returncode == 4 and seen["argv"] == ["a"] and seen["stdin"] == "hi" and not seen["preloaded"]


def test_a_killed_caller_takes_its_child_with_it(probe_dir, server, tmp_path):
    pidfile = tmp_path / "child.pid"
    full = {**os.environ, **server, "PYTHONPATH": str(probe_dir), "PIDFILE": str(pidfile)}
    caller = subprocess.Popen([str(CLIENT), "-m", "probe", "sleep"], env=full, cwd=probe_dir)
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), timeout=60))
    assert child != caller.pid, "the child should be the server's, not a cold process"
    caller.kill()
    caller.wait()
    wait_for(lambda: "exited with 137" in served(tmp_path), timeout=30)  # SIGKILL, as a shell reports it
    assert not psutil.pid_exists(child)


def test_a_killed_server_takes_its_children_and_the_caller_says_so(probe_dir, server, tmp_path):
    pidfile = tmp_path / "child.pid"
    full = {**os.environ, **server, "PYTHONPATH": str(probe_dir), "PIDFILE": str(pidfile)}
    caller = subprocess.Popen([str(CLIENT), "-m", "probe", "sleep"], env=full, cwd=probe_dir,
                              stderr=subprocess.PIPE, text=True)
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), timeout=60))
    server = psutil.Process(psutil.Process(child).ppid())
    assert "kubeloop.forkserver" in server.cmdline(), "the child should be the server's, not a cold process"
    server.kill()
    assert caller.wait(timeout=30) == 1 and "went away while running probe" in caller.stderr.read()
    wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE)


def test_one_server_per_state_folder_kept_to_its_owner(tmp_path, server):
    assert forkserver.ensure(tmp_path / "state", preload=("tomllib",)) == server
    records = list((tmp_path / "state").rglob(f"*{processes.RECORD_SUFFIX}"))
    assert len(records) == 1
    sock = Path(server[forkserver.ENV])
    assert sock.exists(), "ensure() returns once the server listens"
    assert oct(sock.stat().st_mode & 0o777) == "0o600" and oct(sock.parent.stat().st_mode & 0o777) == "0o700"
    python, env = forkserver.python(tmp_path / "state")
    assert python == str(CLIENT) and env == server
    assert forkserver.python(None) == (sys.executable, {})


def test_an_idle_server_exits_and_the_next_caller_starts_cold_until_another_is_started(probe_dir, tmp_path):
    env = forkserver.ensure(tmp_path / "state", preload=("tomllib",), idle=0.5)
    try:
        wait_for(lambda: "idle for 0.5 s: exiting" in served(tmp_path), timeout=30)
        cold = run(probe_dir, env)
        assert cold.returncode == 0 and not json.loads(cold.stdout)["preloaded"]
        assert forkserver.ensure(tmp_path / "state", preload=("tomllib",)) == env
        warm = wait_for(lambda: (r := run(probe_dir, env)) and json.loads(r.stdout)["preloaded"] and r, timeout=60)
        assert warm.returncode == 0
    finally:
        processes.stop_all_under(tmp_path / "state")


def test_a_caller_that_is_not_kubeloop_python_is_turned_away_and_the_next_is_served(probe_dir, server):
    import socket

    stranger = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stranger.connect(server[forkserver.ENV])
    stranger.sendall(b"GET / HTTP/1.1\r\n\r\n")
    try:
        answer = stranger.recv(1)
    except ConnectionResetError:  # closed with our bytes unread
        answer = b""
    assert answer == b"", "the server should close on a stranger"
    warm = wait_for(lambda: (r := run(probe_dir, server)) and json.loads(r.stdout)["preloaded"] and r, timeout=60)
    assert warm.returncode == 0


def test_the_servers_log_of_exits_is_bounded_and_says_so(capsys):
    log = forkserver.ExitLog(limit=2)
    for pid in range(5):
        log.record(f"probe (pid {pid}) exited with 0")
    assert capsys.readouterr().out.splitlines() == [
        "probe (pid 0) exited with 0", "probe (pid 1) exited with 0", "2 exits logged: the later ones are not"]
