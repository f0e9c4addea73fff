"""Who may work on a pool member at once (kubeloop.front.pool): a load that
measures what a model adds must see the member grow by that model alone,
while loads of models already measured, and unloads, can go side by side
(Triton loads several models at once: four python-backend models took
1.9 s together against 5.7 s one after another)."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator


class Gate:
    """Shared work goes beside other shared work; alone work waits for the
    shared work under way to end and runs by itself. An alone holder
    waiting keeps new shared work out, so a measurement is not put off
    for as long as traffic keeps loading measured models."""

    def __init__(self) -> None:
        self._changed = asyncio.Condition()
        self._shared = 0
        self._alone = False
        self._waiting_alone = 0

    @asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(lambda: not self._alone and not self._waiting_alone)
            self._shared += 1
        try:
            yield
        finally:
            async with self._changed:
                self._shared -= 1
                self._changed.notify_all()

    @asynccontextmanager
    async def alone(self) -> AsyncIterator[None]:
        async with self._changed:
            self._waiting_alone += 1
            try:
                await self._changed.wait_for(lambda: not self._alone and not self._shared)
            finally:
                self._waiting_alone -= 1
                self._changed.notify_all()  # a cancelled wait lets shared work in again
            self._alone = True
        try:
            yield
        finally:
            async with self._changed:
                self._alone = False
                self._changed.notify_all()
