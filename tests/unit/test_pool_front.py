"""A pool's front (kubeloop.front.poolfront) as a caller reaches its
services: by a registered model's name where one service serves it, by a
service's Triton name always; a removed routes file takes its service away;
services share the pool's metrics without clearing each other's series,
a removed service's series go with it, and histograms are a service's own
only up to the pool's limit (or in a rollout); a ready answer names the
version the service's routes answer with.
Unit: no Triton (a pooled model's readiness is answered without loading it);
the pool's loads against real tritonservers are tests/components/test_pool.py,
the whole path tests/e2e/test_serving_pools.py (local backend)."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from pathlib import Path

from kubeloop.front.httpserver import Request
from kubeloop.front.poolfront import PoolConfig, PooledFront, PoolMember


def routes(folder: Path, triton_model: str, model: str, canary: int = 0, versions: tuple[str, str] = ("1", "2")) -> Path:
    path = folder / f"{triton_model}.json"
    split = [{"role": "primary", "version": versions[0], "percent": 100 - canary}]
    split += [{"role": "canary", "version": versions[1], "percent": canary}] if canary else []
    path.write_text(json.dumps({
        "service": triton_model.replace(".", "/"), "model": model, "triton_model": triton_model, "triton_url": "",
        "routes": split}))
    return path


def status(front: PooledFront, path: str) -> tuple[int, bytes]:
    async def call() -> tuple[int, bytes]:
        answer = await front.handle(Request("GET", path, {}, b""))
        return answer.status, answer.body
    return asyncio.get_event_loop().run_until_complete(call())


def started(folder: Path) -> tuple[PooledFront, asyncio.AbstractEventLoop]:
    """A pool front over the routes folder (one member no Triton listens
    at), started on an event loop of the test's own."""
    member = PoolMember("http://127.0.0.1:1", "127.0.0.1:1", os.getpid(), 100.0)
    front = PooledFront(PoolConfig("shared", {"m": member}, folder))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(front.start())
    return front, loop


def two_services(tmp_path: Path) -> tuple[Path, PooledFront, asyncio.AbstractEventLoop]:
    """A started pool front over the routes folder of services ml.a and ml.b."""
    folder = tmp_path / "routes"
    folder.mkdir()
    for name in ("ml.a", "ml.b"):
        routes(folder, name, name)
    return (folder, *started(folder))


def test_a_pools_front_reaches_each_service_by_its_model(tmp_path):
    folder = tmp_path / "routes"
    folder.mkdir()
    routes(folder, "ml.a", "fraud")
    routes(folder, "ml.b", "fraud")
    lone = routes(folder, "ml.c", "churn")
    front, loop = started(folder)
    try:
        assert status(front, "/v2/models/ml.a/ready")[0] == 200
        assert status(front, "/v2/models/churn/ready")[0] == 200
        ready = loop.run_until_complete(front.handle(Request("GET", "/v2/models/ml.a/ready", {}, b"")))
        assert b"X-Model-Version: 1\r\n" in ready.headers, "a ready answer names the version its routes answer with"
        code, body = status(front, "/v2/models/fraud/ready")
        assert code == 409 and b"ml.a, ml.b" in body
        assert status(front, "/v2/models/nothing/ready")[0] == 404
        front.pool.failures["ml.a"] = "Triton (m) could not load ml.a: 400 bad config"
        assert status(front, "/v2/models/ml.a/ready") == (503, b"Triton (m) could not load ml.a: 400 bad config")
        lone.unlink()
        loop.run_until_complete(front.sync())
        assert status(front, "/v2/models/churn/ready")[0] == 404
        shown = {s.labels["service"] for metric in front.metrics.registry.collect()
                 if metric.name == "kubeloop_router_traffic_ratio" for s in metric.samples}
        assert shown == {"ml/a", "ml/b"}, "a router keeps its series in the shared metrics, a removed one's go"
        pool = {s.name: s.value for metric in front.metrics.registry.collect() if metric.name.startswith("kubeloop_pool")
                for s in metric.samples if s.labels.get("pool") == "shared"}
        assert pool["kubeloop_pool_loads_total"] == 0 and pool["kubeloop_pool_member_budget_mib"] == 90.0
    finally:
        loop.run_until_complete(front.stop())
        loop.close()


def test_histograms_beyond_the_pools_limit_are_shared_but_a_rollouts_stay_its_own(tmp_path):
    folder = tmp_path / "routes"
    folder.mkdir()
    for name in ("ml.a", "ml.b", "ml.c"):
        routes(folder, name, name)
    rolling = routes(folder, "ml.d", "ml.d", canary=10)
    member = PoolMember("http://127.0.0.1:1", "127.0.0.1:1", os.getpid(), 100.0)
    front = PooledFront(PoolConfig("shared", {"m": member}, folder, detailed_metrics=1))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(front.start())
        for router in front.routers.values():
            router._observe("1", [0.7, 0.2])
        def scored() -> dict[str, float]:
            return {s.labels["service"]: s.value for metric in front.metrics.registry.collect()
                    if metric.name == "kubeloop_prediction_score" for s in metric.samples
                    if s.name.endswith("_count")}
        assert scored() == {"ml/a": 2, "ml/d": 2, "_other": 4}, "ml/a took the one place, ml/d is in a rollout"
        routes(folder, "ml.d", "ml.d")  # its rollout is over: beyond the limit, its histograms are shared
        os.utime(rolling, (1, 1))
        assert front.routers["ml.d.json"].take_up_routes()
        front.routers["ml.d.json"]._observe("1", [0.5])
        assert scored() == {"ml/a": 2, "_other": 5}
    finally:
        loop.run_until_complete(front.stop())
        loop.close()


def test_the_front_takes_up_a_service_renamed_into_its_folder_while_it_skips_unchanged_rounds(tmp_path):
    """The watcher reads every router's file only when the folder changed
    (a thousand routers' stats every half second held up requests): a
    service written the way the backends write (kubeloop.files.write_atomic)
    still joins within a few rounds."""
    from kubeloop.files import write_atomic

    folder = tmp_path / "routes"
    folder.mkdir()
    routes(folder, "ml.a", "fraud")
    member = PoolMember("http://127.0.0.1:1", "127.0.0.1:1", os.getpid(), 100.0)
    front = PooledFront(PoolConfig("shared", {"m": member}, folder))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    async def joined() -> bool:
        for _ in range(40):
            if "ml.b.json" in front.routers:
                return True
            await asyncio.sleep(0.25)
        return False

    try:
        loop.run_until_complete(front.start())
        loop.run_until_complete(asyncio.sleep(1.2))  # rounds with nothing changed: skipped
        write_atomic(folder / "ml.b.json", (folder / "ml.a.json").read_text().replace("ml.a", "ml.b"))
        assert loop.run_until_complete(joined())
        assert status(front, "/v2/models/ml.b/ready")[0] == 200
    finally:
        loop.run_until_complete(front.stop())
        loop.close()


def test_a_pool_pods_front_is_ready_only_once_it_has_taken_up_the_routes_found_at_its_start(tmp_path):
    """A second pool Pod (or one started again) must not get requests for
    services it does not know yet: its readiness waits for the repository
    container's synced file, then for a round of its own after it. A front
    with no synced file configured (the local backend's) is ready at once."""
    folder = tmp_path / "routes"
    folder.mkdir()
    synced = folder / ".synced"
    member = PoolMember("http://127.0.0.1:1", "127.0.0.1:1", os.getpid(), 100.0)
    front = PooledFront(PoolConfig("shared", {"m": member}, folder, synced=synced))
    local = PooledFront(PoolConfig("local", {"m": member}, folder))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)

    def ready_within(seconds: float) -> bool:
        for _ in range(int(seconds / 0.1)):
            if status(front, "/v2/health/ready")[0] == 200:
                return True
            loop.run_until_complete(asyncio.sleep(0.1))  # the front's watcher runs meanwhile
        return False

    try:
        loop.run_until_complete(front.start())
        assert status(local, "/v2/health/ready")[0] == 200
        assert status(front, "/v2/health/ready")[0] == 503 and status(front, "/v2/health/live")[0] == 200
        assert not ready_within(1.2)
        routes(folder, "ml.a", "fraud")
        synced.touch()
        assert ready_within(5)
        assert status(front, "/v2/models/ml.a/ready")[0] == 200, "ready with every route written before the file"
    finally:
        loop.run_until_complete(front.stop())
        loop.run_until_complete(local.pool.close())
        loop.close()


def test_a_split_request_leaves_a_pooled_version_that_could_not_load_to_the_primary(tmp_path):
    """A canary whose version the pool could not load (loaded without it)
    takes no share of the split until it is rolled back; a request whose
    version failed while the model's reload was under way learns so once
    the reload is over, and one whose version the routes then no longer
    name goes to the primary. A version the caller named keeps its own."""
    folder = tmp_path / "routes"
    folder.mkdir()
    routes(folder, "ml.a", "fraud", canary=50)
    front, loop = started(folder)
    try:
        router = front.by_model["ml.a"][0]
        primary, canary = router.config.routes
        assert router._loadable(canary) is canary and router._loadable(primary) is primary

        async def failing_during_a_reload():
            reloaded = front.pool.reloading["ml.a"] = asyncio.Event()
            instead = asyncio.ensure_future(router._instead(canary))
            await asyncio.sleep(0)
            assert not instead.done(), "it waits for the reload under way"
            front.pool.failed_versions["ml.a"] = {"2": "failed to load: Protobuf parsing failed"}
            reloaded.set()
            return await instead

        assert loop.run_until_complete(failing_during_a_reload()) is primary
        assert router._loadable(canary) is primary
        assert status(front, "/v2/models/ml.a/versions/2/ready")[0] == 503, "the canary is unready: rolled back"
        del front.pool.failed_versions["ml.a"]
        assert router._loadable(canary) is canary
        # The routes taken up after a reload name the canary no more (Triton unloaded it as the reload ended):
        # a request that found it gone goes to the primary; one whose canary is still named keeps its answer.
        os.utime(routes(folder, "ml.a", "fraud"), (1000, 1000))
        assert router.take_up_routes()
        assert loop.run_until_complete(router._instead(canary)) == router.config.primary()
        assert loop.run_until_complete(router._instead(primary)) is primary
    finally:
        loop.run_until_complete(front.stop())
        loop.close()


def test_a_services_new_routes_wait_for_its_models_reload_and_hold_up_no_other_service(tmp_path):
    """A changed service keeps the routes it had until the members holding
    its model have loaded it again (a version Triton is still loading
    answers 503), and its reload holds up no other service's change nor the
    front's next round; a change written meanwhile waits for the reload
    under way instead of starting another. Unit: the pool's reload stands in
    (loads on real tritonservers: tests/components/test_pool.py; a held
    model rolled forward while called, local backend:
    tests/e2e/test_serving_pools.py)."""
    folder, front, loop = two_services(tmp_path)
    slow, reloads = asyncio.Event(), []

    async def reload(model: str) -> None:
        reloads.append(model)
        if model == "ml.a":
            await slow.wait()

    def given_a_canary(name: str, written: int, version: str = "2") -> None:
        os.utime(routes(folder, name, name, canary=20, versions=("1", version)), (written, written))

    async def until(done: Callable[[], bool]) -> None:
        for _ in range(100):
            if done():
                return
            await asyncio.sleep(0)
        raise AssertionError("never")

    def split(name: str) -> int:
        return len(front.routers[f"{name}.json"].config.routes)

    async def scenario() -> None:
        front.pool.reload = reload
        for name in ("ml.a", "ml.b"):
            given_a_canary(name, 1000)
        await front.sync()
        await until(lambda: split("ml.b") == 2)
        assert split("ml.a") == 1, "ml.a keeps its routes while its model loads again"
        answer = await front.handle(Request("GET", "/v2/models/ml.a/ready", {}, b""))
        assert b"X-Model-Version: 1\r\n" in answer.headers
        given_a_canary("ml.a", 2000, version="3")  # written again while its reload is under way
        await front.sync()
        assert reloads == ["ml.a", "ml.b"], "no second reload of ml.a while one is under way"
        slow.set()
        await until(lambda: split("ml.a") == 2)
        assert front.routers["ml.a.json"].mtime == 2000
        assert reloads.count("ml.a") == 2, "the file written meanwhile was reloaded for too"

    try:
        loop.run_until_complete(scenario())
    finally:
        loop.run_until_complete(front.stop())
        loop.close()


def test_a_removed_services_unload_holds_up_no_other_service_and_a_file_written_again_waits_for_it(tmp_path):
    """A removed service's model is unloaded beside the front's round: a
    member busy loading another model (its unload waits for the member)
    holds up neither the round nor another service's change; the service's
    file written again meanwhile is served at once, and its changed routes
    wait for the unload under way. Unit: the pool's unload and reload stand
    in (unloads on real tritonservers: tests/components/test_pool.py)."""
    folder, front, loop = two_services(tmp_path)
    slow, calls = asyncio.Event(), []

    async def forget(model: str) -> None:
        calls.append(("unload", model))
        await slow.wait()

    async def reload(model: str) -> None:
        calls.append(("reload", model))

    async def scenario() -> None:
        front.pool.forget, front.pool.reload = forget, reload
        (folder / "ml.a.json").unlink()
        os.utime(routes(folder, "ml.b", "ml.b", canary=20), (1000, 1000))
        await asyncio.wait_for(front.sync(), 1)
        assert "ml.a.json" not in front.routers
        await asyncio.sleep(0)
        assert calls == [("unload", "ml.a"), ("reload", "ml.b")], "ml.b's change went on beside ml.a's unload"
        routes(folder, "ml.a", "ml.a")
        await asyncio.wait_for(front.sync(), 1)
        answer = await front.handle(Request("GET", "/v2/models/ml.a/ready", {}, b""))
        assert answer.status == 200, "written again, the service is served at once"
        os.utime(routes(folder, "ml.a", "ml.a", canary=20), (2000, 2000))
        await front.sync()
        await asyncio.sleep(0)
        assert ("reload", "ml.a") not in calls, "its change waits for the unload under way"
        slow.set()
        for _ in range(10):
            await asyncio.sleep(0)
        await front.sync()
        for _ in range(10):
            await asyncio.sleep(0)
        assert calls[-1] == ("reload", "ml.a") and len(front.routers["ml.a.json"].config.routes) == 2

    try:
        loop.run_until_complete(scenario())
    finally:
        loop.run_until_complete(front.stop())
        loop.close()


def test_routes_that_leave_the_models_repository_as_it_was_are_taken_up_without_a_reload(tmp_path):
    """A canary's next weight names the versions the model holds: its routes
    are taken up at once, with no reload (one that found nothing to load
    still took a round trip to every member holding the model, and Triton
    loaded it all again where its files had been touched). A promotion
    (the primary changes, whose config the model takes) and a new version
    reload it. Unit: the pool's reload stands in."""
    folder, front, loop = two_services(tmp_path)
    reloads = []

    async def reload(model: str) -> None:
        reloads.append(model)

    async def taken_up(written: int, canary: int, versions: tuple[str, str]) -> tuple[str, ...]:
        os.utime(routes(folder, "ml.a", "ml.a", canary=canary, versions=versions), (written, written))
        await front.sync()
        for _ in range(10):
            await asyncio.sleep(0)
        config = front.routers["ml.a.json"].config
        assert [(r.version, r.percent) for r in config.routes] == [
            (versions[0], 100 - canary), *([(versions[1], canary)] if canary else [])]
        return tuple(reloads)

    async def scenario() -> None:
        front.pool.reload = reload
        assert await taken_up(1000, 20, ("1", "2")) == ("ml.a",), "a new canary version is loaded"
        assert await taken_up(2000, 50, ("1", "2")) == ("ml.a",), "the next weight loads nothing"
        assert await taken_up(3000, 50, ("2", "1")) == ("ml.a", "ml.a"), "a promotion takes the new primary's config"
        assert await taken_up(4000, 0, ("2", "1")) == ("ml.a", "ml.a", "ml.a"), "the old version leaves"

    try:
        loop.run_until_complete(scenario())
    finally:
        loop.run_until_complete(front.stop())
        loop.close()
