"""Entity requests that arrive while the online store is being read wait,
and the next read serves all of them at once.

One read of 32 rows costs about twice a read of one (Feast's per-call work
dominates), and reads run one at a time off the event loop, so under
concurrent callers reading each request on its own queues them behind each
other. Nothing waits on a timer: a lone request is read at once, and a read
takes whatever arrived during the previous one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from concurrent.futures import Executor
from typing import Callable, Sequence

from kubeloop.serving.features import RequestError, Retrieved

ReadMany = Callable[[Sequence[dict[str, list]]], list[Retrieved]]

MAX_ROWS_PER_READ = 256
MAX_WAITING = 1024
"""Requests waiting for a read; beyond it a request is refused (503), counted."""


class Coalescer:
    """Reads one online store for many waiting requests at a time."""

    def __init__(self, read_many: ReadMany, executor: Executor, on_refused: Callable[[], None] = lambda: None,
                 max_rows: int = MAX_ROWS_PER_READ, max_waiting: int = MAX_WAITING):
        self.read_many = read_many
        self.executor = executor
        self.on_refused = on_refused
        self.max_rows = max_rows
        self.max_waiting = max_waiting
        self.waiting: deque[tuple[dict[str, list], asyncio.Future]] = deque()
        self.reads = 0
        """Reads made so far (each serving one or more requests)."""
        self._reader: asyncio.Task | None = None

    async def read(self, rows: dict[str, list]) -> Retrieved:
        if len(self.waiting) >= self.max_waiting:
            self.on_refused()
            raise RequestError(503, f"{self.max_waiting} entity requests already wait for the online store: "
                                    "retry, or add router replicas")
        answer = asyncio.get_running_loop().create_future()
        self.waiting.append((rows, answer))
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read_waiting())
        return await answer

    def _take(self) -> list[tuple[dict[str, list], asyncio.Future]]:
        """Waiting requests for one read: at least one, then as many as fit max_rows."""
        batch = [self.waiting.popleft()]
        rows = _row_count(batch[0][0])
        while self.waiting and rows + _row_count(self.waiting[0][0]) <= self.max_rows:
            rows += _row_count(self.waiting[0][0])
            batch.append(self.waiting.popleft())
        return batch

    async def _read_waiting(self) -> None:
        loop = asyncio.get_running_loop()
        while self.waiting:
            batch = self._take()
            self.reads += 1
            try:
                answers = await loop.run_in_executor(self.executor, self.read_many, [rows for rows, _ in batch])
            except Exception as exc:  # Feast's errors have no common base: every request of the read gets it
                for _, answer in batch:
                    if not answer.done():
                        answer.set_exception(exc)
                continue
            for (_, answer), retrieved in zip(batch, answers, strict=True):
                if not answer.done():  # its caller may have gone
                    answer.set_result(retrieved)


def _row_count(rows: dict[str, list]) -> int:
    return len(next(iter(rows.values())))
