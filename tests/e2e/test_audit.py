"""The audit trail against the platform's real MLflow server (local platform;
the registry is the same MLflow a cluster would use, through the same port)."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from mlflow import MlflowClient

from kubeloop.registry.mlflow import MlflowRegistry
from kubeloop.registry.promotion import audit_trail, promote, rollback

pytestmark = pytest.mark.e2e
ROUNDS = 10
# A rollback whose process is SIGKILLed after it recorded the entry and
# tagged the version, just before it moves the alias.
KILLED_ROLLBACK = """
import os, signal, sys
from kubeloop.registry.mlflow import MlflowRegistry
from kubeloop.registry.promotion import rollback


class KilledBeforeTheMove(MlflowRegistry):
    def set_alias(self, name, alias, version):
        os.kill(os.getpid(), signal.SIGKILL)


rollback(KilledBeforeTheMove(sys.argv[1]), sys.argv[2], "champion", by="oncall", reason="incident")
"""


def test_concurrent_promotions_keep_every_entry(platform, namespace):
    """Local: two promoters at once, ROUNDS times each, against MLflow's REST API:
    a read-modify-write of one audit tag lost entries; one tag per entry loses none."""
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    model = f"{namespace}-audit"
    client = MlflowClient(uri)
    client.create_registered_model(model)
    for i in range(1, 2 * ROUNDS + 1):
        client.create_model_version(model, source=f"s3://models/{model}/{i}")
    start = threading.Barrier(2)

    def promoter(alias: str, versions: range) -> None:
        registry = MlflowRegistry(uri)
        for version in versions:
            start.wait(timeout=60)  # both promote at the same moment, every round
            promote(registry, model, str(version), alias, by=alias, reason="concurrency")

    threads = [threading.Thread(target=promoter, args=("champion", range(1, ROUNDS + 1))),
               threading.Thread(target=promoter, args=("challenger", range(ROUNDS + 1, 2 * ROUNDS + 1)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    trail = audit_trail(MlflowRegistry(uri), model)
    assert sorted((e.alias, int(e.version)) for e in trail) == sorted(
        [("champion", v) for v in range(1, ROUNDS + 1)] + [("challenger", v) for v in range(ROUNDS + 1, 2 * ROUNDS + 1)])
    assert client.get_model_version_by_alias(model, "champion").version == str(ROUNDS)


def test_a_rollback_killed_between_its_writes_is_recorded_once(platform, namespace):
    """Local: a rollback killed after recording its entry, before moving the
    alias, then run again: one rollback entry and the alias moved (the retry
    recorded a second entry before)."""
    uri = platform.env()["MLFLOW_TRACKING_URI"]
    model = f"{namespace}-rollback"
    client = MlflowClient(uri)
    client.create_registered_model(model)
    for i in (1, 2):
        client.create_model_version(model, source=f"s3://models/{model}/{i}")
    registry = MlflowRegistry(uri)
    promote(registry, model, "1", "champion", by="ci", reason="first")
    promote(registry, model, "2", "champion", by="ci", reason="better")
    killed = subprocess.run([sys.executable, "-c", KILLED_ROLLBACK, uri, model], capture_output=True, text=True,
                            timeout=120)
    assert killed.returncode == -9, killed.stderr
    assert client.get_model_version_by_alias(model, "champion").version == "2"
    assert [e.action for e in audit_trail(registry, model)][-1] == "rollback", "killed after recording"

    rollback(registry, model, "champion", by="oncall", reason="incident")
    assert client.get_model_version_by_alias(model, "champion").version == "1"
    assert [(e.action, e.version, e.previous) for e in audit_trail(registry, model)] == [
        ("promote", "1", None), ("promote", "2", "1"), ("rollback", "1", "2")]
