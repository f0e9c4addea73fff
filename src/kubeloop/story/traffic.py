"""Requests made of real feature rows, sent the way a scoring caller would."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter, deque
from datetime import datetime
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import requests

from kubeloop.api.signature import ModelSignature
from kubeloop.api.training import TrainingJobSpec


def feature_rows(repo: Path, spec: TrainingJobSpec, columns: list[str], start: datetime | None,
                 end: datetime | None, limit: int = 20_000, seed: int = 0) -> np.ndarray:
    """Rows of the model's features (in its column order) for the labelled
    rows between start and end, point-in-time from Feast (repo: a repository
    folder, or a StoreLocation)."""
    return labelled_feature_rows(repo, spec, columns, start, end, limit, seed)[0]


def labelled_feature_rows(repo: Path, spec: TrainingJobSpec, columns: list[str], start: datetime | None,
                          end: datetime | None, limit: int = 20_000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """feature_rows, and each row's label (the outcome a label pipeline delivers later)."""
    from kubeloop.featurestore.store import LabelRows, training_data

    data = training_data(repo, spec.features.feature_views, LabelRows.of(spec.features.labels), start, end)
    frame = data.frame
    if len(frame) > limit:
        frame = frame.sample(limit, random_state=seed)
    return frame[columns].to_numpy(np.float32), frame[data.label].to_numpy()


def sent_columns(repo: Path, signature: ModelSignature, start: datetime | None, end: datetime | None,
                 limit: int = 20_000, seed: int = 0) -> pd.DataFrame:
    """What a caller sends for the labelled transactions between start and
    end: the entity keys and request-time columns of the model's signature,
    nothing the feature store computes (repo: the example's repository)."""
    rows = pd.read_parquet(repo / "data" / "transactions.parquet")
    if start is not None:
        rows = rows[rows["event_timestamp"] >= pd.Timestamp(start)]
    if end is not None:
        rows = rows[rows["event_timestamp"] < pd.Timestamp(end)]
    rows = rows[[*signature.entities, *signature.request_columns]]
    return (rows.sample(limit, random_state=seed) if len(rows) > limit else rows).reset_index(drop=True)


def entity_request(frame: pd.DataFrame) -> dict:
    """A KServe v2 request of one tensor per column sent, a row per entity."""
    def datatype(column: pd.Series) -> str:
        if pd.api.types.is_integer_dtype(column):
            return "INT64"
        return "FP64" if pd.api.types.is_float_dtype(column) else "BYTES"

    return {"inputs": [{"name": name, "shape": [len(frame)], "datatype": datatype(frame[name]),
                        "data": frame[name].tolist()} for name in frame.columns]}


def vector_request(rows: np.ndarray) -> dict:
    """A KServe v2 request carrying the model's whole feature vectors."""
    return {"inputs": [{"name": "features", "shape": list(rows.shape), "datatype": "FP32",
                        "data": rows.ravel().tolist()}]}


Requests = np.ndarray | pd.DataFrame
"""Feature vectors (one row each), or the columns callers send (entity requests)."""


class Traffic:
    """Steady KServe v2 requests from a background thread. Every request has
    its own caller key, so a canary gets its share; which version answered
    is counted, and how long each answer took (the newest LATENCIES)."""

    LATENCIES = 5000

    def __init__(self, url: str, model: str, rows: Requests, rate: float = 20.0, batch: int = 4, seed: int = 0,
                 reach: Callable[[str], str | None] | None = None):
        self.url = url
        self.path = f"/v2/models/{model}/infer"
        self.reach = reach
        """Maps url to an address this machine reaches (a Service's endpoint
        on the cluster path); asked again after a request fails, since the
        endpoint may have moved (a rolled router Pod)."""
        self._target: str | None = None
        self.rate = rate
        self.batch = batch
        self.rng = np.random.default_rng(seed)
        self.answered: Counter[str] = Counter()
        self.recent: deque[str] = deque(maxlen=200)
        self.latencies: deque[float] = deque(maxlen=self.LATENCIES)
        """Seconds to each answered request, as the caller waited."""
        self.failed = 0
        self.last_error = ""
        self._rows = rows
        self._labels: np.ndarray | None = None
        self.feed = None
        """A kubeloop.story.labels.LabelFeed that gets the outcomes of answered requests."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def use(self, rows: Requests, labels: np.ndarray | None = None) -> None:
        """Send these rows from now on (the recent answers start afresh);
        with labels (one per row) and a label feed, each answered request's
        outcomes go to the feed."""
        with self._lock:
            self._rows, self._labels = rows, labels
            self.recent.clear()

    def start(self) -> "Traffic":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    @property
    def sent(self) -> int:
        return sum(self.answered.values()) + self.failed

    def latency_ms(self) -> dict[str, float]:
        """The median and p99 of the kept answers' latencies (ms); empty before the first."""
        with self._lock:
            kept = np.array(self.latencies)
        if not len(kept):
            return {}
        return {"p50": float(np.quantile(kept, 0.5)) * 1000, "p99": float(np.quantile(kept, 0.99)) * 1000}

    def recent_versions(self, last: int | None = None) -> Counter[str]:
        """Which versions answered the most recent requests (all kept, or the last few)."""
        with self._lock:
            answers = list(self.recent)
        return Counter(answers[-last:] if last else answers)

    def _run(self) -> None:
        session = requests.Session()
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._stop.is_set():
            with self._lock:
                rows, labels, picked = self._rows, self._labels, self.rng.integers(0, len(self._rows), self.batch)
            key = uuid.uuid4().hex
            body = entity_request(rows.iloc[picked]) if isinstance(rows, pd.DataFrame) else vector_request(rows[picked])
            version, error = None, ""
            try:
                target = self._resolve()
                sent = time.perf_counter()
                response = session.post(target, json=body, timeout=5, headers={"X-Request-Key": key})
                took = time.perf_counter() - sent
                if response.status_code == 200:
                    version = response.headers.get("X-Model-Version")
                else:
                    error = f"HTTP {response.status_code}: {response.text[:200]}"
            except (requests.RequestException, LookupError) as exc:
                error = str(exc)
                self._target = None
            if version and labels is not None and self.feed is not None:
                self.feed.record(key, labels[picked].tolist(), time.time())
            with self._lock:
                if version:
                    self.answered[version] += 1
                    self.recent.append(version)
                    self.latencies.append(took)
                else:
                    self.failed += 1
                    self.last_error = error
            next_at += interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _resolve(self) -> str:
        if self._target is None:
            base = self.reach(self.url) if self.reach else self.url
            if base is None:
                raise LookupError(f"no ready endpoint for {self.url}")
            self._target = base + self.path
        return self._target
