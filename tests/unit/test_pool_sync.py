"""A pool Pod's repository container (kubeloop.serving.poolsync): a service's
router file reaches the front's folder only once its versions are fetched,
a failed fetch holds back that service alone, and a service that left is
taken from the front's folder and its model from the repository. Unit, with
a fetch that writes folders instead of calling the registry; the cluster
path, against MLflow in a Pod, is
tests/e2e/test_real_node.py::test_a_pool_pod_serves_fifty_inference_services...
"""

from __future__ import annotations

import json
from pathlib import Path

from kubeloop.serving.poolsync import PoolFolders, sync_once, versions_of


def route(name: str, primary: str, canary: str | None = None, shadow: str | None = None) -> dict:
    routes = [{"role": "primary", "version": primary, "percent": 100 if canary is None else 80}]
    if canary:
        routes.append({"role": "canary", "version": canary, "percent": 20})
    return {"model": "fraud", "triton_model": name, "routes": routes,
            "shadow": {"role": "shadow", "version": shadow, "percent": 10} if shadow else None}


def folders(tmp_path: Path) -> PoolFolders:
    found = PoolFolders(tmp_path / "routes", tmp_path / "served", tmp_path / "models", tmp_path / "work")
    found.routes.mkdir()
    return found


class Fetches:
    def __init__(self, repository: Path, failing: set[str] = frozenset()):
        self.repository, self.failing, self.calls = repository, failing, []

    def __call__(self, model: str, versions: list[str], primary: str, name: str) -> None:
        self.calls.append((name, tuple(versions), primary))
        if name in self.failing:
            raise ConnectionError("the registry is down")
        for version in versions:
            (self.repository / name / version).mkdir(parents=True, exist_ok=True)


def test_every_version_a_route_serves_and_its_primary():
    assert versions_of(route("a", "3", canary="4", shadow="5")) == (["3", "4", "5"], "3")
    assert versions_of(route("a", "3")) == (["3"], "3")


def test_a_route_reaches_the_front_once_fetched_and_a_failed_fetch_holds_back_only_its_own(tmp_path):
    where = folders(tmp_path)
    (where.routes / "ns.a.json").write_text(json.dumps(route("ns.a", "1", canary="2")))
    (where.routes / "ns.b.json").write_text(json.dumps(route("ns.b", "1")))
    fetch = Fetches(where.repository, failing={"ns.b"})
    assert not where.synced.exists()
    problems = sync_once(where, fetch)
    assert [p.split(":")[0] for p in problems] == ["ns.b.json"] and "registry is down" in problems[0]
    # The front is ready after the first round, with every route that round could fetch.
    assert where.synced.exists()
    assert sorted(p.name for p in where.served.glob("*.json")) == ["ns.a.json"]
    assert (where.repository / "ns.a" / "2").is_dir()
    assert (where.served / "ns.a.json").read_text() == (where.routes / "ns.a.json").read_text()

    fetch.failing = set()
    assert sync_once(where, fetch) == []
    assert sorted(p.name for p in where.served.glob("*.json")) == ["ns.a.json", "ns.b.json"]
    # ns.a was up to date: fetched once, in the first round only.
    assert [c for c in fetch.calls if c[0] == "ns.a"] == [("ns.a", ("1", "2"), "1")]


def test_a_changed_route_is_fetched_again_and_a_removed_one_leaves_front_then_repository(tmp_path):
    where = folders(tmp_path)
    (where.routes / "ns.a.json").write_text(json.dumps(route("ns.a", "1")))
    fetch = Fetches(where.repository)
    sync_once(where, fetch)
    (where.routes / "ns.a.json").write_text(json.dumps(route("ns.a", "2")))
    sync_once(where, fetch)
    assert fetch.calls[-1] == ("ns.a", ("2",), "2")
    assert json.loads((where.served / "ns.a.json").read_text())["routes"][0]["version"] == "2"

    (where.routes / "ns.a.json").unlink()
    assert sync_once(where, fetch) == []
    assert not (where.served / "ns.a.json").exists() and not (where.repository / "ns.a").exists()
