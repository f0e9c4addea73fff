"""What a pool counts as a load's growth (kubeloop.front.memory.growth):
the server's own growth and the processes it started, never what its other
processes did meanwhile. Unit, plain data; the readings against real
tritonservers are tests/components/test_pool.py."""

from __future__ import annotations

import psutil
import pytest


from kubeloop.front.memory import growth, private_by_process, private_mib, server_on_port
from tests.support.waiting import wait_for


def test_a_load_grows_by_its_new_process_whatever_the_others_do():
    before = {100: 50.0, 101: 30.0}
    # A new backend process (pid 102); the other model's process shrank as its request ended.
    after = {100: 51.0, 101: 12.0, 102: 28.0}
    assert growth(before, after) == 29.0


def test_a_server_that_shrank_grew_by_nothing_of_its_own():
    assert growth({100: 50.0}, {100: 45.0, 103: 10.0}) == 10.0
    assert growth({100: 50.0}, {}) == 0.0


def test_a_process_and_the_children_it_started_are_read_parent_first_and_summed():
    """A sleeping parent and child (real processes): their memory holds still
    between readings, as this test's own process's would not."""
    import subprocess
    import sys

    child = "import time; time.sleep(60)"
    parent = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {child!r}]); time.sleep(60)"])
    try:
        family = wait_for(lambda: len(private_by_process(parent.pid)) == 2 and private_by_process(parent.pid),
                          timeout=30, what="the parent's child to start")
        assert next(iter(family)) == parent.pid and all(mib > 1 for mib in family.values())
        assert private_mib(parent.pid) == pytest.approx(sum(family.values()), rel=0.05)
    finally:
        for proc in psutil.Process(parent.pid).children(recursive=True):
            proc.kill()
        parent.kill()
        parent.wait()
    assert private_by_process(parent.pid) == {}


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
