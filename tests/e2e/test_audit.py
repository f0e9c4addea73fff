"""The audit trail against the platform's real MLflow server (local platform;
the registry is the same MLflow a cluster would use, through the same port)."""

from __future__ import annotations

import threading

import pytest
from mlflow import MlflowClient

from kubeloop.registry.mlflow import MlflowRegistry
from kubeloop.registry.promotion import audit_trail, promote

pytestmark = pytest.mark.e2e
ROUNDS = 10


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
