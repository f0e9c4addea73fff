"""Which models a pool's members hold and where a request goes
(kubeloop.front.residency): plain data, backend-independent; the pool's I/O
against real tritonservers is proven in tests/components/test_pool.py."""

from __future__ import annotations

import pytest

from kubeloop.front.residency import NoRoom, Placement, Residency, TooLarge


def served(residency: Residency, model: str, size: float, measured: float | None = None) -> Placement:
    """One request, start to end, its load measured at `measured` (default: size)."""
    placement = residency.place(model, size)
    if placement.load:
        residency.loaded(placement.member, model, size if measured is None else measured)
    residency.done(placement.member, model)
    return placement


def test_a_model_is_loaded_on_its_first_request_and_hit_after():
    residency = Residency({"a": 100.0})
    assert served(residency, "m1", 30) == Placement("a", load=True)
    assert served(residency, "m1", 30) == Placement("a", load=False)
    assert (residency.counters.loads, residency.counters.hits, residency.counters.unloads) == (1, 1, 0)


def test_room_is_made_by_unloading_the_least_recently_used_idle_models():
    residency = Residency({"a": 100.0})
    for model in ("m1", "m2", "m3"):
        served(residency, model, 30)
    served(residency, "m1", 30)  # m2 is now the least recently used
    assert served(residency, "m4", 30) == Placement("a", load=True, unload=("m2",))
    assert served(residency, "m5", 55) == Placement("a", load=True, unload=("m3", "m1"))
    assert list(residency.members["a"].loaded) == ["m4", "m5"]
    assert residency.counters.unloads == 3


def test_a_model_a_request_is_using_is_never_unloaded():
    residency = Residency({"a": 60.0})
    busy = residency.place("m1", 30)
    residency.loaded(busy.member, "m1", 30)
    served(residency, "m2", 30)
    assert served(residency, "m3", 30).unload == ("m2",)
    with pytest.raises(NoRoom, match="no pool member has room for m4 \\(40 MiB\\): budgets a 60 MiB"):
        residency.place("m4", 40)
    residency.done(busy.member, "m1")
    assert served(residency, "m4", 40).unload == ("m1", "m3")


def test_a_new_model_goes_where_least_must_be_unloaded_then_where_most_room_is_left():
    residency = Residency({"a": 100.0, "b": 100.0})
    assert served(residency, "m1", 60).member == "a"  # both empty: the first by name
    assert served(residency, "m2", 30).member == "b"  # b has more room left after it
    assert served(residency, "m3", 50).member == "b"  # b fits it without unloading, a does not
    placement = served(residency, "m4", 50)
    assert placement.member == "a" and placement.unload == ("m1",)


def test_concurrent_requests_share_one_load_and_spread_over_the_members_holding_a_model():
    residency = Residency({"a": 100.0, "b": 100.0})
    first = residency.place("hot", 20)
    second = residency.place("hot", 20)  # while the first still loads
    assert first.load and not second.load and first.member == second.member
    residency.loaded(first.member, "hot", 20)
    residency.members["b"].loaded["hot"] = 20.0  # the model is on both members
    third = residency.place("hot", 20)
    assert third.member == "b", "the member with fewer requests under way"


def test_a_load_measured_larger_than_its_room_unloads_idle_models_to_stay_in_budget():
    residency = Residency({"a": 100.0})
    served(residency, "m1", 40)
    served(residency, "m2", 40)
    placement = residency.place("m3", 20)  # estimated
    assert placement.unload == ()
    assert residency.loaded("a", "m3", 45) == ["m1"]
    assert residency.over_budget() == {}
    assert residency.members["a"].used_mib == 85


def test_a_failed_load_frees_its_room_and_is_counted():
    residency = Residency({"a": 50.0})
    placement = residency.place("broken", 50)
    residency.failed(placement.member, "broken")
    residency.done(placement.member, "broken")
    assert residency.members["a"].used_mib == 0 and not residency.members["a"].in_use
    assert served(residency, "m1", 50).load
    assert residency.counters.failed == 1


def test_a_pool_needs_a_member():
    with pytest.raises(ValueError, match="at least one member"):
        Residency({})


def test_a_members_measured_use_beyond_its_models_sizes_leaves_less_room():
    residency = Residency({"a": 100.0, "b": 100.0})
    served(residency, "m1", 30)
    residency.observe("a", 55)  # the first model also loaded the backend's libraries
    assert residency.members["a"].used_mib == 55
    assert served(residency, "m2", 50).member == "b"
    residency.observe("b", 60)
    placement = served(residency, "m3", 50)
    # Both must unload one model; b then has 90 MiB free, a 75.
    assert placement.member == "b" and placement.unload == ("m2",)
    assert not residency.held("m2") and residency.held("m3") and residency.held("m1")


def test_a_model_larger_than_every_budget_is_refused_at_once_naming_the_fix():
    residency = Residency({"a": 100.0, "b": 80.0})
    with pytest.raises(TooLarge, match="big \\(120 MiB\\) is larger than any pool member's budget \\(at most 100"):
        residency.place("big", 120)
    assert residency.counters.loads == 0


def test_a_model_no_longer_served_is_dropped_where_it_was_loaded():
    residency = Residency({"a": 100.0, "b": 100.0})
    served(residency, "m1", 30)
    served(residency, "m2", 30)
    assert residency.forget("m1") == ["a"]
    assert not residency.held("m1") and residency.held("m2")
    assert residency.forget("m1") == [] and residency.counters.unloads == 1


def test_what_the_member_was_measured_to_use_follows_its_loads_and_unloads():
    # The first model loads the backend's libraries too: the member measures
    # more than its models' sizes. Unloading models takes their sizes off
    # that measure, so one over-large load unloads only what it must.
    residency = Residency({"a": 100.0})
    for model in ("m1", "m2", "m3"):
        served(residency, model, 20)
    residency.observe("a", 90.0)  # 60 of models, 30 of libraries
    placement = residency.place("m4", 20)
    assert placement.unload == ("m1",)
    assert residency.loaded("a", "m4", 35) == ["m2"]
    assert residency.members["a"].used_mib == 85.0  # 90 - 20 (m1) + 35 (m4) - 20 (m2)


def test_a_hot_model_is_copied_onto_another_member_with_room_and_its_requests_stay_where_it_is_loaded():
    residency = Residency({"a": 100.0, "b": 100.0}, spread_at=2)
    served(residency, "hot", 40)
    first = residency.place("hot", 40)
    assert first == Placement("a", load=False)  # one request under way: not hot yet
    second = residency.place("hot", 40)
    assert second.member == "a" and not second.load and second.spread == Placement("b", load=True)
    assert residency.members["b"].loading == {"hot": 40}
    third = residency.place("hot", 40)  # the copy is loading: requests still go where the model is loaded
    assert third.member == "a" and third.spread is None  # b holds it (loading) with nothing under way there
    residency.loaded("b", "hot", 40)
    residency.done("b", "hot")  # the copy's load is over
    assert residency.place("hot", 40).member == "b"  # now the least busy member holding it
    counters = residency.counters
    assert (counters.loads, counters.spreads, counters.hits) == (2, 1, 4)
    assert residency.forget("hot") == ["a", "b"]


def test_a_hot_model_is_not_copied_where_no_other_member_has_room_or_spreading_is_off():
    residency = Residency({"a": 100.0, "b": 50.0}, spread_at=1)
    served(residency, "hot", 60)
    busy = residency.place("other", 40)
    assert busy.member == "b"
    assert residency.place("hot", 60).spread is None  # b's budget cannot hold it
    residency.done("b", "other")
    off = Residency({"a": 100.0, "b": 100.0})
    served(off, "hot", 40)
    assert [off.place("hot", 40).spread for _ in range(5)] == [None] * 5


def test_a_copy_unloads_only_idle_models_least_recently_used_first():
    residency = Residency({"a": 100.0, "b": 100.0}, spread_at=1)
    served(residency, "hot", 60)
    for model in ("b1", "b2"):
        served(residency, model, 30)  # b2 lands on b beside b1 (a has 40 left: b1 fits there)
    where = {m: name for name, member in residency.members.items() for m in member.loaded}
    assert where == {"hot": "a", "b1": "b", "b2": "b"}
    copy = residency.place("hot", 60).spread
    assert copy == Placement("b", load=True, unload=("b1",))


def test_a_call_carrying_joined_requests_counts_each_of_them_toward_a_hot_model():
    residency = Residency({"a": 100.0, "b": 100.0}, spread_at=4)
    served(residency, "hot", 40)
    joined = residency.place("hot", 40, requests=4)
    assert joined.spread == Placement("b", load=True)
    residency.done("a", "hot", requests=4)
    assert residency.members["a"].in_use == {}
    assert residency.copies("hot") == 1  # b's copy is loading
    residency.loaded("b", "hot", 40)
    assert residency.copies("hot") == 2


def test_a_member_that_started_again_holds_nothing_and_its_models_load_again():
    """A pool Pod's member container restarted (kubeloop.front.poolfront
    finds its server under a new pid): what it held is loaded again on the
    next request, with no unload counted and its room free again."""
    residency = Residency({"a": 100.0})
    for model in ("m1", "m2"):
        served(residency, model, 40)
    assert residency.emptied("a") == ["m1", "m2"]
    assert residency.members["a"].used_mib == 0 and not residency.held("m1")
    assert served(residency, "m1", 40) == Placement("a", load=True)
    assert (residency.counters.loads, residency.counters.unloads) == (3, 0)


def test_a_model_is_busy_for_other_pool_pods_once_every_member_holding_it_loaded_has_spread_at_under_way():
    residency = Residency({"a": 100.0, "b": 100.0}, spread_at=2)
    assert not residency.busy("hot"), "held nowhere"
    served(residency, "hot", 40)
    residency.place("hot", 40, requests=2)
    assert residency.busy("hot")
    residency.members["b"].loaded["hot"] = 40  # a copy on b, idle
    assert not residency.busy("hot"), "a member holding it has room for its requests"
    residency.members["b"].in_use["hot"] = 2
    assert residency.busy("hot")
    off = Residency({"a": 100.0}, spread_at=0)
    served(off, "hot", 40)
    off.place("hot", 40, requests=8)
    assert not off.busy("hot"), "spreading off"
