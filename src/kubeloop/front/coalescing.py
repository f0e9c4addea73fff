"""Requests that arrive while a call is under way wait, and the next call
serves all of them at once.

The router makes two kinds of calls whose cost is mostly per call, not per
row: reads of a Feast online store (one read of 32 rows costs about twice a
read of one) and Triton requests (the HTTP work of the router and of Triton
dominates a small model's compute). Under concurrent callers, making each
request's call on its own queues them behind each other. Nothing waits on a
timer: a lone request is served at once, and a call takes whatever arrived
during the previous one.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

from kubeloop.front.features import RequestError

Item = TypeVar("Item")
Result = TypeVar("Result")

MAX_ROWS_PER_CALL = 256
MAX_WAITING = 1024
"""Requests waiting for a call; beyond it a request is refused (503), counted."""


class Coalescer(Generic[Item, Result]):
    """Serves the requests waiting for one resource, many per call, at most
    max_calls calls at a time. serve_many answers a list of items in order;
    an exception it raises is every item's. A call carries items of one kind
    only, in the order they came (see _take)."""

    def __init__(self, serve_many: Callable[[list[Item]], Awaitable[list[Result]]], rows: Callable[[Item], int],
                 waiting_for: str, kind: Callable[[Item], Hashable] = lambda _: None,
                 on_refused: Callable[[], None] = lambda: None, max_rows: int = MAX_ROWS_PER_CALL,
                 max_waiting: int = MAX_WAITING, max_calls: int = 1):
        self.serve_many = serve_many
        self.rows = rows
        self.waiting_for = waiting_for
        self.kind = kind
        self.on_refused = on_refused
        self.max_rows = max_rows
        self.max_waiting = max_waiting
        self.max_calls = max_calls
        """Calls under way at once."""
        self.waiting: deque[tuple[Item, asyncio.Future]] = deque()
        self.calls = 0
        """Calls made so far (each serving one or more requests)."""
        self.busy = 0
        """Calls under way or about to start."""
        self.tasks: set[asyncio.Task] = set()
        """The calls' own tasks (the event loop keeps only weak references)."""

    @property
    def idle(self) -> bool:
        """No call under way and nobody waiting: the next item is served alone, at once."""
        return self.busy == 0 and not self.waiting

    async def submit(self, item: Item, alone: bool = True) -> Result:
        """The item's result. alone: whether an item finding nothing under
        way goes at once, in the caller's task; False when others are about
        to follow in this turn of the event loop (the rest of a joined read's
        requests), so that they share its call."""
        if self.idle and alone:
            return await self._alone(item)
        if len(self.waiting) >= self.max_waiting:
            self.on_refused()
            raise RequestError(503, f"{self.max_waiting} requests already wait for {self.waiting_for}: "
                                    "retry, or add router replicas")
        answer = asyncio.get_running_loop().create_future()
        self.waiting.append((item, answer))
        self._start_calls()
        return await answer

    async def _alone(self, item: Item) -> Result:
        """Nothing to join: the call is made in the caller's own task (a task
        of its own cost a lone request a turn of the event loop)."""
        self.busy += 1
        self.calls += 1
        try:
            answers = await self.serve_many([item])
        finally:
            self._release()
        if len(answers) != 1:
            raise RuntimeError(f"{len(answers)} answers for 1 requests")
        return answers[0]

    def _start_calls(self) -> None:
        # A call takes its requests when it starts, so requests submitted in
        # one turn of the event loop share it.
        while self.busy < min(self.max_calls, len(self.waiting)):
            self.busy += 1
            call = asyncio.create_task(self._serve())
            self.tasks.add(call)
            call.add_done_callback(self.tasks.discard)

    def _release(self) -> None:
        """A call is over: the next one starts before its callers are
        answered, so the resource works while they are (Triton sat idle
        while the router answered a joined call's callers)."""
        self.busy -= 1
        self._start_calls()

    def _take(self) -> list[tuple[Item, asyncio.Future]]:
        """Waiting requests for one call: the first, then every other one of
        its kind that fits max_rows, in the order they came. The others keep
        their order for the next call: taking only the run of one kind at
        the head, callers of two kinds interleaved (tritonclient's, which
        name their outputs, beside others) made a call each."""
        batch = [self.waiting.popleft()]
        rows, kind = self.rows(batch[0][0]), self.kind(batch[0][0])
        left: deque[tuple[Item, asyncio.Future]] = deque()
        while self.waiting and rows < self.max_rows:
            waiting = self.waiting.popleft()
            size = self.rows(waiting[0])
            if self.kind(waiting[0]) == kind and rows + size <= self.max_rows:
                rows += size
                batch.append(waiting)
            else:
                left.append(waiting)
        left.extend(self.waiting)
        self.waiting = left
        return batch

    async def _serve(self) -> None:
        if not self.waiting:  # an earlier call took them
            self._release()
            return
        batch = self._take()
        self.calls += 1
        try:
            answers = await self.serve_many([item for item, _ in batch])
            if len(answers) != len(batch):  # no caller may wait forever for a missing answer
                raise RuntimeError(f"{len(answers)} answers for {len(batch)} requests")
        except BaseException as exc:  # Feast's errors have no common base: every request of the call gets it
            self._release()
            for _, answer in batch:
                if not answer.done():
                    answer.set_exception(exc if isinstance(exc, Exception) else RuntimeError("the call was cancelled"))
            if not isinstance(exc, Exception):
                raise
            return
        self._release()
        for (_, answer), result in zip(batch, answers, strict=True):
            if not answer.done():  # its caller may have gone
                answer.set_result(result)
