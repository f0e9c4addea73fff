"""The router under steady traffic while its request-log disk goes away and
comes back (local backend: a real tritonserver started by the operator, and
a real router process in front of it).

Scale: the issue asks for ten minutes of traffic; `make test` (CI's 90
minutes on two cores) runs 30 seconds from 4 callers (some thousands of
requests), with the log folder unwritable through the middle third, and a
request-log queue of 500 rows so the outage overflows it.
KUBELOOP_ROUTER_SOAK_SECONDS=600 runs the full ten minutes."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections import Counter

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from kubeloop import processes
from tests.support.faults import infer, inference_service, registered_model, status_of
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
SECONDS = float(os.environ.get("KUBELOOP_ROUTER_SOAK_SECONDS", "30"))
CALLERS, QUEUE = 4, 500


def metric(url: str, name: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_the_router_keeps_answering_while_its_log_disk_is_gone(platform, kube, namespace, local_operator, tmp_path):
    """Local: every request answered; every answered request either written to the
    log or counted as dropped; write errors counted; logging resumes by itself."""
    model = registered_model(platform, namespace, "router")
    op = local_operator()
    kube.create(inference_service(namespace, model))
    wait_for(lambda: status_of(kube, "InferenceService", namespace, "fraud").get("phase") == "Ready",
             timeout=180, interval=0.5, what="serving")
    config = json.loads((op.work / "serving" / f"{namespace}-fraud" / "router.json").read_text())
    logs = tmp_path / "requests"
    config.update(request_log=str(logs), sample_rate=1.0, log_limits={"queue_rows": QUEUE})
    (tmp_path / "router.json").write_text(json.dumps(config))
    port = processes.free_port()
    router = processes.start("router", [sys.executable, "-m", "kubeloop.front.router", "--config",
                                        str(tmp_path / "router.json"), "--port", str(port)], tmp_path / "logs")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url, model), timeout=30, what="the router answering")
        counts, stop = [Counter() for _ in range(CALLERS)], threading.Event()

        def caller(mine: Counter) -> None:
            while not stop.is_set():
                mine[infer(url, model).status_code] += 1

        threads = [threading.Thread(target=caller, args=(mine,)) for mine in counts]
        for thread in threads:
            thread.start()
        try:
            time.sleep(SECONDS / 3)
            shutil.move(logs, tmp_path / "requests.away")
            logs.write_text("the disk is gone")  # every write under it now fails (ENOTDIR)
            wait_for(lambda: metric(url, "kubeloop_request_log_write_errors_total") > 0, timeout=30,
                     what="a failed flush counted")
            time.sleep(SECONDS / 3)
            logs.unlink()
            shutil.move(tmp_path / "requests.away", logs)
            time.sleep(SECONDS / 3)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        answered = sum(counts, Counter())
        assert set(answered) == {200}, answered
        assert metric(url, "kubeloop_request_log_dropped_total") > 0, "the outage should have overflowed the queue"

        def written() -> int:
            return sum(len(p.read_text().splitlines()) for p in logs.glob("*.jsonl"))

        def dropped() -> float:
            # Rows dropped since the last flush reach the counter at the next
            # one: a loaded machine can overflow the queue up to the end.
            return metric(url, "kubeloop_request_log_dropped_total")

        total = sum(answered.values()) + 1  # and the one answer that said the router was up
        wait_for(lambda: written() + dropped() == total, timeout=30,
                 what=f"every one of {total} answered requests written or counted as dropped",
                 seen=lambda: f"{written()} written, {dropped():.0f} dropped")
        print(f"{total} requests answered, {written()} logged, {dropped():.0f} dropped, "
              f"{metric(url, 'kubeloop_request_log_write_errors_total'):.0f} failed flushes")
    finally:
        processes.stop(router)


def _answers(url: str, model: str) -> bool:
    try:
        return infer(url, model).status_code == 200
    except requests.RequestException:  # not listening yet
        return False
