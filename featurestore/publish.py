"""The card-transactions example's repository published as Pods open a
team's store: its registry (s3://, where its feature_store.yaml says), its
Parquet sources (s3://) and its online store (Redis on an address Pods
reach). A Pod never sees the repository folder on this machine, so
`kubeloop demo --cluster` and the cluster tests train, materialise and serve
from the published copy; the folder stays the story's working copy (drift is
written there, then uploaded again)."""

from __future__ import annotations

import copy
from pathlib import Path


def upload_sources(repo: Path, url: str) -> list[str]:
    """Copy the repository's Parquet sources (data/<name>.parquet) below the
    s3:// prefix url; the keys written. The endpoint and credentials are the
    AWS SDK's own (AWS_* in the environment)."""
    import boto3

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3")
    keys = []
    for path in sorted((repo / "data").glob("*.parquet")):
        keys.append(f"{prefix}/{path.name}")
        s3.upload_file(str(path), bucket, keys[-1])
    return keys


def publish_sources(repo: Path, url: str, endpoint: str) -> None:
    """Upload the sources below url and register the example's feature views
    and its labelled rows (the transactions source training joins onto)
    reading them there (FileSource on s3:// with the object store's
    endpoint) in the repository's registry (an s3:// one, for a published
    store)."""
    from feast import FileSource

    from kubeloop.featurestore import definitions
    from kubeloop.featurestore.store import open_store

    def moved_source(source: FileSource) -> FileSource:
        return FileSource(name=source.name, path=f"{url}/{source.name}.parquet",
                          timestamp_field=source.timestamp_field, s3_endpoint_override=endpoint)

    upload_sources(repo, url)
    views = []
    for view in definitions.FEATURE_VIEWS:
        moved = copy.copy(view)
        moved.batch_source = moved_source(view.batch_source)
        views.append(moved)
    open_store(repo).apply([*definitions.ENTITIES, *map(moved_source, definitions.DATA_SOURCES), *views,
                            *definitions.ON_DEMAND_FEATURE_VIEWS])
