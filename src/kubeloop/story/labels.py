"""Ground truth that arrives late, as a team's label pipeline would deliver
it: for every answered request, its rows' outcomes some delay later, as
Parquet files in the InferenceService's groundTruth location (request key,
row, label, when it became known)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

PENDING = 200_000
"""Rows waiting for their delay; beyond that the oldest are dropped, and counted."""


class LabelFeed:
    """Labels of answered requests, written `delay` seconds after the answer,
    every `every` seconds, one file each time."""

    def __init__(self, folder: Path, delay: float, every: float = 2.0):
        self.folder = Path(folder)
        self.delay = delay
        self.every = every
        self.pending: deque[tuple[float, str, int, int]] = deque(maxlen=PENDING)
        self.written = 0
        self.dropped = 0
        self._files = itertools.count()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="labels", daemon=True)

    def start(self) -> "LabelFeed":
        self.folder.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def record(self, key: str, labels: list[int], answered_at: float) -> None:
        """The outcomes of a request's rows, due `delay` after its answer."""
        with self._lock:
            room = self.pending.maxlen - len(self.pending)
            self.dropped += max(0, len(labels) - room)
            self.pending.extend((answered_at + self.delay, key, row, int(label)) for row, label in enumerate(labels))

    def flush(self, now: float | None = None) -> int:
        """Write the labels that are due; how many."""
        now = time.time() if now is None else now
        with self._lock:
            due = []
            while self.pending and self.pending[0][0] <= now:
                due.append(self.pending.popleft())
        if not due:
            return 0
        table = pa.table({"request_id": [d[1] for d in due], "row": pa.array([d[2] for d in due], pa.int32()),
                          "label": pa.array([d[3] for d in due], pa.int64()),
                          "label_timestamp": pa.array([d[0] for d in due], pa.float64())})
        name = self.folder / f"labels-{int(now * 1000)}-{next(self._files):06d}.parquet"
        pq.write_table(table, name.with_suffix(".tmp"))
        name.with_suffix(".tmp").rename(name)  # readers never see half a file
        self.written += len(due)
        return len(due)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.flush()
