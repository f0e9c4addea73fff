"""One materialisation of a feature store in a Kubernetes Job's Pod (the
cluster path: the operator never runs Feast in its own Pod).

    python -m kubeloop.featurestore.job [--summary PATH]

The run comes from $KUBELOOP_MATERIALIZE (the store's StoreLocation JSON,
the views read online, the end as Unix time; see
kubeloop.featurestore.freshness.job_request). It is Feast's incremental
materialisation of those views up to the end (materialize_views, the same
function the operator runs for the local backend); --summary writes what
the registry records afterwards, compact, to PATH (the Pod's termination
message, which the operator reads). Exit status 1 when a view failed: the
summary still says which, and how far every view got.

Only a store recorded as feature_store.yaml text can be opened here: its
registry, its sources and its online store must be reachable from the Pod
(for example a registry and Parquet sources in object storage, Redis).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from pathlib import Path

from kubeloop.api.jobs import SUMMARY_BYTES
from kubeloop.featurestore.freshness import Materialized, read_job_request

ENV = "KUBELOOP_MATERIALIZE"
log = logging.getLogger("kubeloop.featurestore.job")


def serve_s3_through_pyarrow() -> bool:
    """Let Feast's file offline store read s3:// sources without s3fs.

    Feast writes and inspects S3 Parquet through pyarrow's S3 filesystem,
    but reads sources through dask and fsspec, whose s3 protocol is s3fs
    (not on kubeloop's images). Where s3fs is missing, fsspec's s3 protocol
    becomes pyarrow's filesystem behind fsspec's own ArrowFSWrapper, with
    the endpoint the source names (s3_endpoint_override) or the Pod's
    AWS_ENDPOINT_URL_S3, and the AWS SDK's usual credentials. True when it
    was installed (False: s3fs is there and serves)."""
    try:
        import s3fs  # noqa: F401
        return False
    except ImportError:
        pass
    import fsspec
    from fsspec.implementations.arrow import ArrowFSWrapper

    class ArrowS3(ArrowFSWrapper):
        protocol = ("s3", "s3a")
        root_marker = ""

        def __init__(self, client_kwargs: dict | None = None, key: str | None = None, secret: str | None = None,
                     token: str | None = None, **kwargs):
            from pyarrow.fs import S3FileSystem

            endpoint = (client_kwargs or {}).get("endpoint_url") or os.environ.get("AWS_ENDPOINT_URL_S3")
            options = {"region": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
                       **({"endpoint_override": endpoint} if endpoint else {})}
            if key and secret:
                options.update(access_key=key, secret_key=secret, session_token=token)
            super().__init__(S3FileSystem(**options), **kwargs)

        @classmethod
        def _strip_protocol(cls, path):  # noqa: ANN001, ANN206 - fsspec's signature
            path = path if isinstance(path, str) else str(path)
            for prefix in ("s3://", "s3a://"):
                path = path.removeprefix(prefix)
            return path.rstrip("/")

    fsspec.register_implementation("s3", ArrowS3, clobber=True)
    fsspec.register_implementation("s3a", ArrowS3, clobber=True)
    return True


def run(request: str) -> Materialized:
    from kubeloop.featurestore.store import materialize_views

    need, end = read_job_request(request)
    serve_s3_through_pyarrow()
    return materialize_views(need, end)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kubeloop.featurestore.job")
    parser.add_argument("--summary", type=Path, help="also write the result here, at most 4 KiB")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    try:
        result = run(os.environ[ENV])
    except Exception as exc:  # the store could not even be opened; said in the operator's condition
        log.exception("materialisation failed")
        result = Materialized("", {}, f"{type(exc).__name__}: {exc}")
    if args.summary:
        args.summary.write_text(result.summary(SUMMARY_BYTES))
    log.info("materialised %s in %.1f s: ends %s, error %s", result.project or "?", time.monotonic() - started,
             result.ends, result.error)
    return 0 if result.error is None else 1


if __name__ == "__main__":
    raise SystemExit(main())
