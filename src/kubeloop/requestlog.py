"""The request log: what the serving front answered, for drift monitoring and
skew checks. One format wherever it is kept: JSON lines, one record per
request (`ts`, `key`, `role`, `version`, `features`, `outputs`, and
`request` for entity requests), in files partitioned by the hour they were
written in, so that a reader opens only the hours of its window.

Two stores, chosen by the location's form:
- a folder (`/var/log/requests/ml-fraud`): `requests-YYYYMMDD-HH[.N].jsonl`,
  appended to, rotated by size, expired by age and total size;
- object storage (`s3://bucket/prefix`, any S3; endpoint and credentials
  from the environment, as boto3 reads them): objects cannot be appended
  to, so each flush writes one object,
  `prefix/dt=YYYY-MM-DD/hour=HH/<writer>-<ms>-<seq>.jsonl`, and flushes
  come seconds apart to keep objects few. Retention there is the bucket's
  lifecycle rule: a writer only ever puts objects.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson

LOG_QUEUE = 10_000
"""Rows held between flushes, or while the store refuses them."""

ANSWERED = frozenset({"primary", "canary"})
"""Roles whose rows are answers a caller got. A "shadow" row is a mirrored
copy's answer and a "paired" row the champion's second opinion on a
challenger's request (for the rollout's comparison): counting either as
traffic would count a request twice."""


def answered(record: dict) -> bool:
    """Whether a logged record is an answer a caller got (records written
    before roles were logged were all answers)."""
    return record.get("role", "primary") in ANSWERED


def position(key: str, salt: str = "") -> float:
    """A stable position in [0, 100) for a request key: the router splits
    traffic by it, and samples what it logs by it (salt "log"), so a label
    that arrives later for a key can be told apart as sampled or not."""
    digest = hashlib.sha256(f"{salt}{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % 10000 / 100


def sampled(key: str, rate: float) -> bool:
    """Whether the request log keeps the rows of this key at this sample rate."""
    return position(key, "log") < rate * 100


class LogStoreError(Exception):
    """The store refused a write or a read (full disk, unreachable object store)."""


@dataclass(frozen=True)
class LogLimits:
    """How much request log a writer keeps (a folder's limits; an object
    store's size is its bucket's lifecycle rule)."""

    file_bytes: int = 64 * 2**20
    """A file is rotated once it is this large."""
    total_bytes: int = 1024 * 2**20
    """The oldest files go once the folder holds more."""
    retention_seconds: float = 7 * 86400
    """Files not written to for this long go (drift windows are shorter)."""
    queue_rows: int = LOG_QUEUE
    """Rows held between flushes, or while the store refuses them."""


class RequestLog:
    """Sampled request rows waiting to be written: a bounded queue; what does
    not fit is dropped and counted."""

    def __init__(self, capacity: int = LOG_QUEUE) -> None:
        self.rows: list[dict] = []
        self.capacity = capacity
        self.dropped = 0
        """Rows dropped because the queue was full (since the last look)."""

    def add(self, row: dict) -> bool:
        """Queue a row; False (and counted) when the queue is full."""
        if len(self.rows) >= self.capacity:
            self.dropped += 1
            return False
        self.rows.append(row)
        return True

    def take(self) -> list[dict]:
        rows, self.rows = self.rows, []
        return rows

    def put_back(self, rows: list[dict]) -> None:
        """Rows a failed write could not keep go back in front, as far as
        the queue holds them (the rest dropped and counted)."""
        self.rows = rows + self.rows
        self.dropped += max(0, len(self.rows) - self.capacity)
        del self.rows[self.capacity:]


class LogStore(Protocol):
    flush_seconds: float
    """How often a writer flushes to this store."""

    def write(self, rows: list[dict], now: float) -> None:
        """Write rows (raises LogStoreError; nothing is half-written)."""

    def expire(self, now: float) -> int:
        """Remove what the limits no longer keep; how many files went."""

    def records(self, since: float = 0.0) -> Iterator[dict]:
        """Every complete record in files written since `since` (coarse: by
        file; callers filter on `ts`)."""


def line(row: dict) -> bytes:
    """A row as one JSON line (orjson: the standard encoder took 15 us a row)."""
    return orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY)


def encode(rows: list[dict | bytes]) -> bytes:
    """JSON lines. A row may come encoded by line() already: the router
    encodes each as it queues it, so a flush only joins bytes (encoding
    thousands of rows in the writer thread held the GIL from requests)."""
    return b"".join(row if type(row) is bytes else line(row) for row in rows)


def complete_lines(lines: Iterator[str]) -> Iterator[dict]:
    """A last line without its newline is still being written: left for the next read."""
    for line in lines:
        if line.endswith("\n"):
            yield json.loads(line)


class FolderStore:
    flush_seconds = 0.5

    def __init__(self, folder: str | Path, limits: LogLimits = LogLimits()):
        self.folder = Path(folder)
        self.limits = limits

    def write(self, rows: list[dict], now: float) -> None:
        try:
            with open(self._current(now), "ab") as out:
                out.write(encode(rows))
        except OSError as exc:
            raise LogStoreError(str(exc)) from exc

    def _current(self, now: float) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        stem = time.strftime("requests-%Y%m%d-%H", time.gmtime(now))
        part = 0
        while True:
            path = self.folder / (f"{stem}.jsonl" if part == 0 else f"{stem}.{part}.jsonl")
            if not path.exists() or path.stat().st_size < self.limits.file_bytes:
                return path
            part += 1

    def expire(self, now: float) -> int:
        """Files past their retention, then the oldest until the folder fits
        total_bytes (never the file being written)."""
        limits = self.limits
        files = []
        for path in self.folder.glob("requests-*.jsonl"):
            try:
                info = path.stat()
            except FileNotFoundError:
                continue
            files.append((info.st_mtime, info.st_size, path))
        files.sort()
        total, removed = sum(size for _, size, _ in files), 0
        for mtime, size, path in files[:-1]:
            if now - mtime <= limits.retention_seconds and total <= limits.total_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size
            removed += 1
        return removed

    def records(self, since: float = 0.0) -> Iterator[dict]:
        for path in sorted(self.folder.glob("*.jsonl")):
            try:
                if path.stat().st_mtime < since:
                    continue
                handle = open(path)
            except FileNotFoundError:  # expired by the writer meanwhile
                continue
            with handle:
                yield from complete_lines(handle)


class ObjectStore:
    flush_seconds = 5.0

    def __init__(self, url: str, client=None):  # noqa: ANN001 - a boto3 S3 client
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise ValueError(f"expected s3://bucket[/prefix], got {url}")
        self.bucket, self.prefix = bucket, prefix.strip("/")
        self._client = client
        self._writer = f"{socket.gethostname()}-{os.getpid()}"
        self._sequence = itertools.count()

    @property
    def client(self):  # noqa: ANN201 - boto3's client has no importable type
        if self._client is None:
            import boto3

            self._client = boto3.client("s3")
        return self._client

    def _hour(self, at: float) -> str:
        return f"{self.prefix}/" * bool(self.prefix) + time.strftime("dt=%Y-%m-%d/hour=%H/", time.gmtime(at))

    def write(self, rows: list[dict], now: float) -> None:
        key = f"{self._hour(now)}{self._writer}-{int(now * 1000)}-{next(self._sequence):06d}.jsonl"
        try:
            self.client.put_object(Bucket=self.bucket, Key=key, Body=encode(rows),
                                   ContentType="application/x-ndjson")
        except Exception as exc:  # botocore's errors share no base with OSError
            raise LogStoreError(f"s3://{self.bucket}/{key}: {exc}") from exc

    def expire(self, now: float) -> int:
        return 0

    def records(self, since: float = 0.0) -> Iterator[dict]:
        # Keys sort by the hour they were written in: one listing that
        # starts at the window's first hour skips every older object.
        for key in self._keys(self._hour(since) if since > 0 else None):
            body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()
            yield from complete_lines(iter(body.splitlines(keepends=True)))

    def _keys(self, start_after: str | None) -> Iterator[str]:
        listing = {"Bucket": self.bucket, "Prefix": f"{self.prefix}/" if self.prefix else ""}
        if start_after:
            listing["StartAfter"] = start_after
        for page in self.client.get_paginator("list_objects_v2").paginate(**listing):
            yield from (item["Key"] for item in page.get("Contents", []))


def open_store(location: str, limits: LogLimits = LogLimits()) -> FolderStore | ObjectStore:
    return ObjectStore(location) if location.startswith("s3://") else FolderStore(location, limits)


def request_records(location: str | Path, since: float = 0.0) -> Iterator[dict]:
    """Every complete record of a request log (a folder or an s3:// prefix)
    in the files of the hours since `since`."""
    return open_store(str(location)).records(since)
