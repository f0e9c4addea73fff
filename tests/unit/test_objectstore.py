"""Backend: none (pure builders). The object store's command line and
identities file, from plain data."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from kubeloop.dev import objectstore

PORTS = {name: 20000 + i for i, name in enumerate(objectstore.PORTS)}


def test_every_listener_binds_loopback_on_a_port_given_here(tmp_path):
    argv = objectstore.build_server_argv("weed", tmp_path, PORTS, tmp_path / "identities.json")
    flags = dict(arg.split("=", 1) for arg in argv[2:] if "=" in arg)
    assert flags["-ip"] == flags["-ip.bind"] == "127.0.0.1"
    for name, port in PORTS.items():  # seaweedfs-master-grpc -> -master.port.grpc
        server, _, grpc = name.removeprefix("seaweedfs-").partition("-")
        assert flags[f"-{server}.port" + (".grpc" if grpc else "")] == str(port)
    # Listeners that would otherwise open on default ports, and the phone-home.
    assert flags["-s3.port.iceberg"] == flags["-s3.port.lance"] == "0"
    assert flags["-master.telemetry"] == "false"
    assert not {"-webdav", "-sftp", "-iam", "-mq.broker", "-debug"} & set(argv)
    assert all(not arg.startswith("-metricsPort") for arg in argv)
    assert flags["-s3.config"] == str(tmp_path / "identities.json")
    assert all(flags[f"-{s}.localSocket"].startswith(str(tmp_path)) for s in ("filer", "s3"))


def test_grpc_socket_files_are_the_paths_weed_hard_codes():
    assert [str(p) for p in objectstore.grpc_socket_files(PORTS)] == [
        f"/tmp/seaweedfs-{server}-grpc-{PORTS[f'seaweedfs-{server}-grpc']}.sock"
        for server in ("master", "volume", "filer", "s3")]
    assert objectstore.grpc_socket_files({}) == []


def test_identities_file_is_private_and_reads_back(tmp_path):
    path = tmp_path / "objectstore" / "identities.json"
    credentials = objectstore.generate_credentials()
    objectstore.write_identities(path, credentials)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert objectstore.read_credentials(path) == credentials
    assert objectstore.generate_credentials() != credentials


def test_only_the_platform_identity_exists():
    identities = objectstore.build_identities(objectstore.Credentials("AK", "SK"))["identities"]
    assert [i["name"] for i in identities] == ["kubeloop"]  # no anonymous identity
    assert identities[0]["credentials"] == [{"accessKey": "AK", "secretKey": "SK"}]


@pytest.mark.parametrize("name", ["AWS_ENDPOINT_URL_S3", "MLFLOW_S3_ENDPOINT_URL"])
def test_env_points_s3_clients_at_the_endpoint(name):
    env = objectstore.env("http://127.0.0.1:1", objectstore.Credentials("AK", "SK"))
    assert env[name] == "http://127.0.0.1:1"
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("AK", "SK")


def test_weed_is_the_wheels_binary():
    assert Path(objectstore.weed_binary()).exists()
