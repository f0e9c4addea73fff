"""A pooled service's readiness per role (kubeloop.serving.base): Triton
loads a model's versions all or none, so a canary or shadow version that
failed to load is rolled back and leaves the pool at once, while a primary
that failed has nothing to roll back to; while a new primary is taken up,
the old version the fronts still answer with is said to answer. Unit, plain data; the pool's
front naming the failed version against real tritonservers:
tests/components/test_pool.py; through the operator on the local backend:
tests/e2e/test_serving_pools.py."""

from __future__ import annotations

from kubeloop.api.refs import ObjectRef
from kubeloop.api.serving import InferenceServiceSpec
from kubeloop.gpu.placement import PlacementDecision
from kubeloop.registry.base import ModelVersion
from kubeloop.serving.base import (
    ServedVersion, ServingRequest, ServingState, pooled_answering, pooled_readiness, taken_out)

FAILED = "version 2 failed to load: Internal: InvalidProtobuf"


def test_a_version_that_failed_to_load_beside_a_ready_primary_is_rolled_back():
    ready, rolled_back, message = pooled_readiness({"primary": (True, ""), "canary": (False, FAILED),
                                                     "shadow": (True, "")})
    assert (ready, rolled_back) == ({"primary": True, "shadow": True}, ("canary",))
    assert message == f"canary {FAILED}; rolled back"


def test_a_canary_not_yet_taken_up_or_a_failed_primary_rolls_nothing_back():
    ready, rolled_back, message = pooled_readiness({"primary": (True, ""), "canary": (False, "")})
    assert (ready, rolled_back, message) == ({"primary": True, "canary": False}, (), "")
    ready, rolled_back, message = pooled_readiness({"primary": (False, FAILED), "canary": (False, FAILED)})
    assert (ready, rolled_back, message) == ({"primary": False, "canary": False}, (), FAILED)


def test_roles_rolled_back_leave_the_pool_in_the_same_reconcile():
    spec = InferenceServiceSpec.model_validate({"model": {"name": "churn", "alias": "champion"}, "pool": "shared"})
    versions = tuple(ServedVersion(role, ModelVersion("churn", v, f"models:/churn/{v}"), p)
                     for role, v, p in (("primary", "1", 80), ("canary", "2", 20)))
    placement = PlacementDecision(feasible=True, mode="cpu", reason="no GPU requested")
    request = ServingRequest(ObjectRef("InferenceService", "team", "churn", "uid-1"), spec, versions, placement)
    asked: list[list[str]] = []

    def ensure(wanted: ServingRequest) -> ServingState:
        asked.append([v.role for v in wanted.versions])
        return ServingState(url="http://pool", ready={"primary": True},
                            rolled_back=("canary",) if len(wanted.versions) == 2 else ())

    assert taken_out(ensure, request).rolled_back == ("canary",)
    assert asked == [["primary", "canary"], ["primary"]]
    asked.clear()
    assert taken_out(ensure, ServingRequest(request.ref, spec, versions[:1], placement)).rolled_back == ()
    assert asked == [["primary"]], "nothing rolled back: ensured once"


def test_the_old_version_answers_while_every_front_still_serves_one():
    """One front or two, mid-way: the old version answers; a front that
    answers nothing, or a new version every front routes to (not ready
    there: its load failed), name none."""
    assert pooled_answering("3", ["1"]) == "1"
    assert pooled_answering("3", ["3", "1"]) == "1"
    assert pooled_answering("3", ["1", None]) is None
    assert pooled_answering("3", ["3", "3"]) is None
    assert pooled_answering("3", []) is None
