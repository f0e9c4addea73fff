"""Keeping online stores fresh: the schedule's decisions with plain data,
the Materializer with an injected run (no Feast), the lag metrics, and the
InferenceService reconciler asking for its store. Backend: none (unit)."""

from __future__ import annotations

import json
import math
import threading
import time

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from kubeloop.api.serving import InferenceServiceSpec, InferenceServiceStatus
from kubeloop.api.signature import TAG as SIGNATURE_TAG, ModelSignature
from kubeloop.featurestore.freshness import (
    Materialized, Materializer, StoreNeed, StoreState, freshness, lag_seconds, merge_needs, next_run, store_key,
)
from kubeloop.featurestore.base import FeatureStores
from kubeloop.monitoring.metrics import FreshnessCollector
from kubeloop.operator.ports import Ports
from kubeloop.operator.reconcilers.serving import reconcile_inference_service
from kubeloop.registry.memory import InMemoryRegistry
from kubeloop.registry.tags import FEATURE_STORE
from tests.unit.fakes import RecordingServing
from tests.unit.test_reconcile_serving import REF

STORE = json.dumps({"path": "/repos/fraud"})


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


class Runs:
    """A run that records its calls and answers what the test says."""

    def __init__(self, ends: dict[str, float | None] | None = None):
        self.calls: list[tuple[StoreNeed, float]] = []
        self.error: str | None = None
        self.ends = ends or {"card_activity": 990.0}
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, need: StoreNeed, end: float) -> Materialized:
        self.calls.append((need, end))
        self.gate.wait(5)
        return Materialized("fraud", dict(self.ends), self.error)


def settled(materializer: Materializer, runs: int, store: str = STORE) -> StoreState:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        states = materializer.states([store])
        if states and states[0].runs >= runs and not states[0].running:
            return states[0]
        time.sleep(0.01)
    raise AssertionError(f"{runs} run(s) did not finish: {materializer.states()}")


def test_needs_of_one_store_merge_their_views_and_take_the_shortest_interval():
    merged = merge_needs([StoreNeed(STORE, ("a", "b"), 600), StoreNeed(STORE, ("c",), 60),
                          StoreNeed("other", ("x",), 30)])
    assert merged[STORE] == StoreNeed(STORE, ("a", "b", "c"), 60)
    assert merged["other"] == StoreNeed("other", ("x",), 30)


@pytest.mark.parametrize("failures, expected", [(0, 600), (1, 2), (2, 4), (5, 32), (12, 600)])
def test_next_run_is_an_interval_after_success_and_backs_off_after_failures(failures, expected):
    assert next_run(100.0, 600.0, failures) == 100.0 + expected


def test_lag_is_time_since_the_last_materialised_end_and_infinite_when_never():
    assert lag_seconds(1000.0, 940.0) == 60.0
    assert lag_seconds(1000.0, 1005.0) == 0.0  # an end in the future (clock skew) is no lag
    assert math.isinf(lag_seconds(1000.0, None))


def test_freshness_condition_says_first_run_failure_and_success():
    need = StoreNeed(STORE, ("card_activity",), 60)
    assert freshness([StoreState(need)], 1000)[:2] == ("Unknown", "FirstRun")
    ok = StoreState(need, runs=1, project="fraud", ends={"card_activity": 970.0})
    assert freshness([ok], 1000) == ("True", "Materialized",
                                     "online store materialised: feature store fraud up to 30s ago, every 60s")
    failing = StoreState(need, runs=3, failures=2, project="fraud", ends={"card_activity": 700.0},
                         last_error="FileNotFoundError: card_activity.parquet")
    status, reason, message = freshness([ok, failing], 1000)
    assert (status, reason) == ("False", "MaterializationFailed")
    assert "failed 2 time(s) in a row" in message and "card_activity.parquet" in message and "300s behind" in message


def test_a_due_store_runs_once_at_a_time_then_waits_its_interval():
    clock, runs = Clock(), Runs()
    runs.gate.clear()  # the first run hangs until the test lets it go
    materializer = Materializer(runs, clock=clock)
    materializer.want("uid-1", [StoreNeed(STORE, ("card_activity",), 60)])
    materializer.want("uid-2", [StoreNeed(STORE, ("card_profile",), 600)])
    assert [n.views for n in materializer.due()] == [("card_activity", "card_profile")]
    clock.now += 120
    assert materializer.due() == []  # still running: never two runs of one store
    runs.gate.set()
    state = settled(materializer, 1)
    assert runs.calls[0][1] == 1000.0 and state.next_run == clock.now + 60 and state.last_error is None
    assert materializer.due() == []
    clock.now += 60
    assert len(materializer.due()) == 1
    settled(materializer, 2)


def test_failures_are_retried_with_backoff_and_the_lag_keeps_the_registrys_last_end():
    clock, runs = Clock(), Runs({"card_activity": 990.0})
    materializer = Materializer(runs, clock=clock)
    materializer.want("uid-1", [StoreNeed(STORE, ("card_activity",), 600)])
    materializer.due()
    settled(materializer, 1)
    runs.error, runs.ends = "OSError: offline store unreadable", {}
    clock.now += 600
    materializer.due()
    state = settled(materializer, 2)
    assert (state.failures, state.failed_runs, state.next_run) == (1, 1, clock.now + 2)
    assert state.ends == {"card_activity": 990.0} and state.last_error.startswith("OSError")
    clock.now += 2
    materializer.due()
    assert settled(materializer, 3).next_run == clock.now + 4


def test_a_run_that_raises_is_a_failed_run_not_a_dead_scheduler():
    clock = Clock()

    def broken(need, end):
        raise ValueError("feature_store.yaml: bad online_store")

    materializer = Materializer(broken, clock=clock)
    materializer.want("uid-1", [StoreNeed(STORE, ("v",), 60)])
    materializer.due()
    state = settled(materializer, 1)
    assert state.last_error == "ValueError: feature_store.yaml: bad online_store" and state.failures == 1


def test_a_store_no_service_needs_is_dropped():
    materializer = Materializer(Runs(), clock=Clock())
    materializer.want("uid-1", [StoreNeed(STORE, ("v",), 60)])
    materializer.want("uid-2", [StoreNeed(STORE, ("v",), 60)])
    materializer.forget("uid-1")
    assert len(materializer.states()) == 1
    materializer.want("uid-2", [])
    assert materializer.states() == [] and materializer.due() == []


def test_lag_metrics_per_view_with_the_stale_limit_and_runs_by_result():
    clock = Clock()
    runs = Runs({"card_activity": 940.0, "card_profile": None})
    materializer = Materializer(runs, clock=clock)
    materializer.want("uid-1", [StoreNeed(STORE, ("card_activity", "card_profile"), 60)])
    materializer.due()
    settled(materializer, 1)
    registry = CollectorRegistry()
    registry.register(FreshnessCollector(FeatureStores(materializer=materializer), clock=clock))
    samples = {(s.name, s.labels.get("view") or s.labels.get("result")): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples}
    assert samples[("kubeloop_online_features_lag_seconds", "card_activity")] == 60.0
    assert math.isinf(samples[("kubeloop_online_features_lag_seconds", "card_profile")])
    assert samples[("kubeloop_online_features_max_lag_seconds", None)] == 180.0
    assert samples[("kubeloop_online_features_materializations_total", "succeeded")] == 1
    assert samples[("kubeloop_online_features_materializations_total", "failed")] == 0
    labels = next(f.samples[0].labels for f in text_string_to_metric_families(generate_latest(registry).decode())
                  if f.name == "kubeloop_online_features_lag_seconds")
    assert labels["store"] == store_key(STORE) and labels["project"] == "fraud"


@pytest.mark.parametrize("every", ["0s", "500ms", "2d"])
def test_materialize_every_outside_one_second_to_a_day_is_refused_naming_the_field(every):
    with pytest.raises(ValidationError, match="materializeEvery"):
        InferenceServiceSpec.model_validate({"model": {"name": "m", "alias": "a"},
                                             "features": {"materializeEvery": every}})


class OnlineServing(RecordingServing):
    reads_online_features = True


def _ports(serving, materializer, views: list[str], store: str = STORE):
    registry = InMemoryRegistry()
    signature = ModelSignature(task="binary", feature_columns=["x"], classes=["0", "1"], feature_views=views)
    v1 = registry.add_version("fraud", "s3://m/1", tags={SIGNATURE_TAG: signature.to_json(), FEATURE_STORE: store})
    registry.set_alias("fraud", "champion", v1.version)
    return Ports(registry=registry, serving={"local": serving}, default_serving_backend="local",
                 features=FeatureStores(materializer=materializer), clock=Clock())


def test_the_service_asks_for_its_store_on_its_interval_and_says_how_fresh_it_is():
    materializer = Materializer(Runs(), clock=Clock())
    ports = _ports(OnlineServing(), materializer, ["card_activity", "transaction_features"])
    spec = InferenceServiceSpec.model_validate({"model": {"name": "fraud", "alias": "champion"},
                                                "features": {"materializeEvery": "2m"}})
    out = reconcile_inference_service(REF, spec, InferenceServiceStatus(), ports)
    assert [s.need for s in materializer.states()] == [
        StoreNeed(STORE, ("card_activity", "transaction_features"), 120.0)]
    fresh = next(c for c in out.status.conditions if c.type == "FeaturesFresh")
    assert (fresh.status, fresh.reason) == ("Unknown", "FirstRun")
    assert out.status.phase == "Ready"  # freshness is reported, it does not take the service down
    materializer.due()
    settled(materializer, 1)
    out = reconcile_inference_service(REF, spec, out.status, ports)
    fresh = next(c for c in out.status.conditions if c.type == "FeaturesFresh")
    assert (fresh.status, fresh.reason) == ("True", "Materialized")


@pytest.mark.parametrize("serving, features", [(RecordingServing(), {"materializeEvery": "2m"}), (OnlineServing(), {})],
                         ids=["vectors-only-backend", "no-schedule-asked-for"])
def test_nothing_is_scheduled_for_a_backend_that_takes_vectors_only_or_a_service_that_asks_for_none(
        serving, features):
    materializer = Materializer(Runs(), clock=Clock())
    ports = _ports(serving, materializer, ["card_activity"])
    spec = InferenceServiceSpec.model_validate({"model": {"name": "fraud", "alias": "champion"}, "features": features})
    out = reconcile_inference_service(REF, spec, InferenceServiceStatus(), ports)
    assert materializer.states() == []
    assert all(c.type != "FeaturesFresh" for c in out.status.conditions)


def test_an_operator_without_a_backend_that_reads_online_features_runs_no_materializer():
    """Cluster path (wiring): the chart's operator (kubernetes backend) runs in an image without Feast or
    pandas; it failed to start when the materialiser was built regardless."""
    from kubeloop.operator.settings import OperatorConfig
    from kubeloop.operator.wiring import build_materializer

    config = OperatorConfig.from_env({})
    assert build_materializer(config, {"kubernetes": RecordingServing()}, kube=None) is None
    materializer = build_materializer(config, {"local": OnlineServing()}, kube=None)
    try:
        assert materializer is not None
    finally:
        materializer.stop()
