"""What a pool counts as a load's growth (kubeloop.front.memory.growth):
the server's own growth and the processes it started, never what its other
processes did meanwhile. Unit, plain data; the readings against real
tritonservers are tests/components/test_pool.py."""

from __future__ import annotations

import os

from kubeloop.front.memory import growth, private_by_process, private_mib, server_on_port


def test_a_load_grows_by_its_new_process_whatever_the_others_do():
    before = {100: 50.0, 101: 30.0}
    # A new backend process (pid 102); the other model's process shrank as its request ended.
    after = {100: 51.0, 101: 12.0, 102: 28.0}
    assert growth(before, after) == 29.0


def test_a_server_that_shrank_grew_by_nothing_of_its_own():
    assert growth({100: 50.0}, {100: 45.0, 103: 10.0}) == 10.0
    assert growth({100: 50.0}, {}) == 0.0


def test_this_process_has_private_memory():
    readings = private_by_process(os.getpid())
    assert next(iter(readings)) == os.getpid() and readings[os.getpid()] > 1
    assert private_mib(os.getpid()) >= readings[os.getpid()]


def test_a_server_is_found_by_its_http_port_and_not_by_another_port():
    """A pool Pod's front finds each member's tritonserver among the Pod's
    processes by the --http-port it was started with (a real process here)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--http-port=47001"])
    try:
        assert server_on_port(47001) == proc.pid
        assert server_on_port(47002) is None
    finally:
        proc.kill()
        proc.wait()
    assert server_on_port(47001) is None
