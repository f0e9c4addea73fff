"""Files a step hands to another through object storage or a shared folder:
`s3://bucket/key` through boto3 (endpoint and credentials from the
environment, as boto3 reads them: a Pod gets them from a Secret by
reference), anything else as a local path."""

from __future__ import annotations

import shutil
from pathlib import Path


def _bucket_key(uri: str) -> tuple[str, str]:
    if "://" in uri and not uri.startswith("s3://"):
        raise ValueError(f"{uri}: only s3:// URIs and local paths are supported")
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    if not bucket or not key:
        raise ValueError(f"expected s3://bucket/key, got {uri}")
    return bucket, key


def _s3():  # noqa: ANN202 - boto3's client has no importable type
    import boto3

    return boto3.client("s3")


def download(uri: str, path: Path, missing_ok: bool = False) -> Path | None:
    """uri's object at path (its folders made); None for a missing object
    when missing_ok."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        if "://" in uri:
            from botocore.exceptions import ClientError

            try:
                _s3().download_file(*_bucket_key(uri), str(path))
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                    raise FileNotFoundError(uri) from None
                raise
        else:
            shutil.copyfile(uri, path)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise
    return path


def upload(path: Path, uri: str) -> None:
    """path's file as uri's object (for a local uri, written whole before it appears)."""
    if "://" in uri:
        _s3().upload_file(str(path), *_bucket_key(uri))
        return
    target = Path(uri)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(path, partial)
    partial.replace(target)
