"""A pool's repository (kubeloop.serving.repository.put_pooled): a registered
version is fetched once for every service of the pool that serves it, each
service's model links the fetched files, and the fetched versions kept are
bounded; a version leaves the disk one change after it left the config
(a member may still be loading it). Unit, with a fetch that writes a version's folder instead of
calling MLflow; the local pool against MLflow is tests/e2e/test_serving_pools.py
(local backend) and the pool Pod's is tests/e2e/test_real_node.py (cluster path)."""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from kubeloop.serving import repository
from kubeloop.serving.repository import put_pooled, remove_pooled


class Registry:
    def __init__(self):
        self.fetches = []

    def __call__(self, tracking_uri: str, model: str, version: str, into: Path, backend: str = "python"):
        self.fetches.append((model, version))
        folder = into / model / version
        folder.mkdir(parents=True)
        (folder / "model.py").write_text(f"# {model} {version}")
        config = mc.ModelConfig(name=model, backend=backend)
        return config


def test_a_version_is_fetched_once_for_every_service_and_linked_into_each(tmp_path, monkeypatch):
    registry = Registry()
    monkeypatch.setattr(repository, "fetch_version", registry)
    models, work = tmp_path / "models", tmp_path / "work"
    for service in ("ns.a", "ns.b", "ns.c"):
        put_pooled("uri", "fraud", ["3"], "3", service, models, work)
    assert registry.fetches == [("fraud", "3")]
    inodes = {(models / s / "3" / "model.py").stat().st_ino for s in ("ns.a", "ns.b", "ns.c")}
    assert len(inodes) == 1, "each service's model links the one fetched copy"
    assert 'name: "ns.b"' in (models / "ns.b" / "config.pbtxt").read_text()
    put_pooled("uri", "fraud", ["3", "4"], "3", "ns.a", models, work)  # a canary: only the new version is fetched
    assert registry.fetches == [("fraud", "3"), ("fraud", "4")]
    remove_pooled("ns.a", models, work)
    assert not (models / "ns.a").exists() and (models / "ns.b" / "3" / "model.py").exists()


def test_the_versions_kept_fetched_are_bounded(tmp_path, monkeypatch):
    registry = Registry()
    monkeypatch.setattr(repository, "fetch_version", registry)
    monkeypatch.setattr(repository, "FETCHED_KEPT", 3)
    models, work = tmp_path / "models", tmp_path / "work"
    for version in range(1, 6):
        put_pooled("uri", "fraud", [str(version)], str(version), f"ns.s{version}", models, work)
    assert sorted(p.name for p in (work / "registry" / "fraud").iterdir()) == ["3", "4", "5"]
    put_pooled("uri", "fraud", ["1"], "1", "ns.late", models, work)  # no longer kept: fetched again
    assert registry.fetches.count(("fraud", "1")) == 2


def test_a_version_leaves_the_disk_one_change_after_it_left_the_config(tmp_path, monkeypatch):
    monkeypatch.setattr(repository, "fetch_version", Registry())
    models, work = tmp_path / "models", tmp_path / "work"

    def on_disk() -> list[str]:
        return sorted(p.name for p in (models / "ns.a").iterdir() if p.is_dir())

    put_pooled("uri", "fraud", ["1", "2"], "1", "ns.a", models, work)
    put_pooled("uri", "fraud", ["1"], "1", "ns.a", models, work)  # the canary rolled back
    assert on_disk() == ["1", "2"] and repository.served_versions(models / "ns.a" / "config.pbtxt") == ["1"]
    put_pooled("uri", "fraud", ["1"], "1", "ns.a", models, work)  # a resync changes nothing
    assert on_disk() == ["1", "2"]
    put_pooled("uri", "fraud", ["3"], "3", "ns.a", models, work)  # the next change
    assert on_disk() == ["1", "3"]
