"""Background servers' environment."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import psutil

from kubeloop import processes
from tests.support.waiting import wait_for


def test_a_server_does_not_inherit_feasts_prometheus_folder(tmp_path, monkeypatch):
    # As importing feast leaves it in the operator's environment.
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "/tmp/feast_metrics_gone")
    monkeypatch.setenv("KUBELOOP_KEPT", "yes")
    out = tmp_path / "env.json"
    code = f"import json, os; open({str(out)!r}, 'w').write(json.dumps(sorted(os.environ)))"
    record = processes.start("probe", [sys.executable, "-c", code], tmp_path, env={"EXTRA": "1"})
    assert processes.wait_exit(record, timeout=30) == 0
    names = set(json.loads(out.read_text()))
    assert {"KUBELOOP_KEPT", "EXTRA"} <= names
    assert not names & set(processes.INHERITED_NOT)


def test_down_stops_what_was_started_under_the_state_dir(tmp_path):
    """Local: `kubeloop dev down` after `make demo` stopped the platform but left the
    operator's tritonserver and router (sessions of their own) running."""
    from kubeloop.dev.platform import Platform

    state = tmp_path / "demo"
    sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
    triton = processes.start("tritonserver", sleeper, state / "operator" / "serving" / "ns-svc" / "logs")
    router = processes.start("router", sleeper, state / "operator" / "serving" / "ns-svc" / "logs")
    outside = processes.start("unrelated", sleeper, tmp_path / "elsewhere")
    try:
        assert triton.running() and router.running()
        Platform(state).down()
        assert not triton.running() and not router.running()
        assert outside.running() and not state.exists()
    finally:
        for record in (triton, router, outside):
            processes.stop(record)


def test_listening_ports_come_from_below_the_ephemeral_range_and_never_twice():
    """Backend: none (host sockets). An ephemeral port can be taken by any
    outgoing connection before the server binds it."""
    ephemeral_start = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = [processes.free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    assert all(10000 <= port < min(ephemeral_start, 30000) for port in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))


def test_a_port_a_node_port_service_may_take_comes_from_the_api_servers_static_band():
    """Backend: none (host sockets). The real node's operator port: a chart's
    NodePort Service names it, so the API server must not have handed it to
    another Service (it assigns from above the static band first)."""
    ports = [processes.free_port(node_port=True) for _ in range(20)]
    assert len(set(ports)) == 20
    assert all(30000 <= port < 30086 for port in ports), ports


def test_stopping_a_crashed_process_stops_what_it_started(tmp_path):
    """Local: a platform process SIGKILLed (a crash) left its children running
    (MLflow's server workers kept the node's address bound); stopping its
    record stops them, and never a group its pid went to later."""
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']);"
            " time.sleep(300)")
    record = processes.start("server", [sys.executable, "-c", code], tmp_path)
    child = wait_for(lambda: psutil.Process(record.pid).children(), timeout=30, what="the server's worker")[0]
    os.kill(record.pid, signal.SIGKILL)
    processes.wait_exit(record, timeout=10)
    assert child.is_running() and not record.running()
    processes.stop(record)
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    reused = processes.ProcessRecord("other", os.getpid(), record.create_time, record.log)
    assert processes._session_members(reused) == []


def test_two_processes_drawing_ports_at_once_never_draw_the_same():
    """Backend: none (host sockets and the machine's reservation file). Two
    pytest workers starting platforms at once drew the same port, and the
    second server could not bind it: 2 x 300 draws from about 20,000 ports
    collide about 4 times without the reservations."""
    code = "from kubeloop import processes; print(*(processes.free_port() for _ in range(300)))"
    drawers = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    drawn = [set(map(int, drawer.communicate(timeout=120)[0].split())) for drawer in drawers]
    assert [len(ports) for ports in drawn] == [300, 300]
    assert not drawn[0] & drawn[1]
