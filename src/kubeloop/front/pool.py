"""A pool of Triton servers in explicit model-control mode serving many
models (the I/O half; the decisions are kubeloop.front.residency).

A request for a model goes to the member that holds it; a model no member
holds is loaded on its first request through Triton's repository API (over
gRPC: kubeloop.front.modelcontrol says why), after
the member unloads its least recently used idle models to make room. A
model's first load is measured: the member's memory before and after it,
the load alone on its member, so the growth is that model's; the loads of
models measured before, and unloads, go side by side
(kubeloop.front.gate). That is host memory, what a
member's processes hold; an OptimizedModel's footprint is GPU memory, so it
sizes nothing here (no pool here measures a GPU). Cold loads are counted and
timed; the record of their times is bounded.

Triton loads a model's versions all or none: where one version cannot load
(a canary's broken files), a load (cold, or a held model's reload) loads the
others, with the model's config narrowed to them
(kubeloop.front.versionpolicy), so the model keeps serving its primary while
the broken version is rolled back.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import deque
from contextlib import asynccontextmanager
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable, Iterable

from kubeloop.front.gate import Gate
from kubeloop.front.memory import growth, python_stubs
from kubeloop.front.modelcontrol import LoadError, Member, ModelControl
from kubeloop.front.residency import NoRoom, Placement, Residency, TooLarge
from kubeloop.front.upstream import UpstreamError
from kubeloop.front.versionpolicy import config_without

log = logging.getLogger("kubeloop.pool")
LOAD_TIMEOUT_SECONDS = 300.0
"""Triton answers a load once the model is ready or has failed."""
COLD_LOADS_KEPT = 1024
SETTLE_SECONDS = 10.0
PEAK_SECONDS = 0.05
"""How often a member's memory is measured while it loads a model."""
STILL_SECONDS = 0.25
"""A member whose memory fell by less than a MiB over this long after an
unload has let the unloaded models' memory go."""
HEADROOM = 0.1
"""The share of a member's budget left free when models are placed and
unloaded: what serving grows a member by between two measurements (the
backend's buffers as requests run) stays within the budget."""


UNLOADED = "unloaded"
"""Triton's reason for a version that is unavailable because it was unloaded."""


UNSERVED = (LoadError, NoRoom)
"""What a request to a pooled model can end with short of an answer: its
load failed, or no member has room for it (TooLarge is a NoRoom)."""


class Pool:
    """members: name -> the member's addresses; budgets: name -> MiB, of which
    HEADROOM is kept free; processes: name -> the member's memory now by
    process (kubeloop.front.memory.private_by_process of the Triton server:
    it and its backends' processes, the server first); estimate_mib: the
    room a model of unknown size gets until its first load is measured;
    repository: the members' model repository, read for a model's config
    when some of its versions cannot load (None: such a model fails whole);
    stubs: which of a member's processes are which model's python-backend
    stubs (kubeloop.front.memory.python_stubs)."""

    def __init__(self, members: dict[str, Member], budgets: dict[str, float],
                 processes: Callable[[str], dict[int, float]], estimate_mib: float = 0.0, spread_at: int = 0,
                 repository: Path | None = None,
                 stubs: Callable[[Iterable[int]], dict[int, str]] = python_stubs):
        self.urls = {name: member.http for name, member in members.items()}
        self.repository_dir = repository
        self.residency = Residency({name: budget * (1 - HEADROOM) for name, budget in budgets.items()}, spread_at)
        self.processes = processes
        self.stubs = stubs
        self.empty = {name: self.memory(name) for name in members}
        """Each member's memory holding no model (members start empty: explicit model control, none at start)."""
        self.sizes: dict[str, float] = {}
        """Model -> what its first load grew its member by."""
        self.peaks: dict[str, float] = {}
        """Model -> the most its last load grew its member by, while it loaded."""
        self.estimate_mib = estimate_mib
        self.repository = ModelControl({name: member.grpc for name, member in members.items()}, LOAD_TIMEOUT_SECONDS)
        self.gates = {name: Gate() for name in members}
        """A first load alone on its member (its growth is then that model's); other work side by side."""
        self.unloading: dict[tuple[str, str], asyncio.Event] = {}
        """(member, model) -> set once the model's unload there is over: its
        next load there waits for it, or the unload would undo the load."""
        self.pending: dict[tuple[str, str], asyncio.Future] = {}
        """Loads under way; requests for the model wait for them."""
        self.over: set[str] = set()
        """Members measured over budget while everything they held was in use."""
        self._released = asyncio.Event()
        """Set (and replaced) whenever a request ends: placements waiting for room retry."""
        self.cold_seconds: deque[float] = deque(maxlen=COLD_LOADS_KEPT)
        """The latest cold loads' times, from the request's arrival to the model ready."""
        self.failures: dict[str, str] = {}
        """Model -> why its last load failed (until one succeeds); bounded by the models served."""
        self.failed_versions: dict[str, dict[str, str]] = {}
        """Model -> the versions its last failed load could not load, and why
        (Triton loads a model's versions all or none: one version that cannot
        load fails the rest too)."""
        self.reloading: dict[str, asyncio.Event] = {}
        """Model -> set once its reload under way is over."""
        self.copies: set[asyncio.Task] = set()
        """Hot models' copies loading on further members (at most one per member and model)."""

    def has_loaded(self, model: str) -> bool:
        """Whether a member holds the model loaded (not only loading)."""
        return any(model in m.loaded for m in self.residency.members.values())

    def warm(self, model: str) -> None:
        """Load a copy of a model that another pool Pod found hot, in the
        background, where no member holds it and one has room (unloading
        idle models only); its requests keep going to that Pod meanwhile.
        A model whose last load here failed is left alone."""
        if self.residency.held(model) or model in self.failures:
            return
        try:
            placement = self._placement_now(model, 1)
        except NoRoom:
            return
        self.residency.counters.spreads += 1
        self._copy(placement, model)

    def any_url(self) -> str:
        """A member's URL, for what any member answers alike (the server's metadata)."""
        return next(iter(self.urls.values()))

    async def reload(self, model: str) -> None:
        """The model's config or versions changed: the members holding it
        load it again (Triton loads the new versions before it unloads the
        old ones: requests keep being answered). Where a new version cannot
        load, the others are loaded and it is named (its service's canary is
        rolled back); where nothing could be loaded instead, Triton keeps
        serving the versions it had, and the model stays held."""
        reloaded = self.reloading[model] = asyncio.Event()
        try:
            for name, member in self.residency.members.items():
                if model in member.loaded:
                    async with self.gates[name].shared():
                        try:
                            await self._loading(name, model)
                        except LoadError as exc:
                            await self._failed(name, model, exc)
                            raise
                    self.failures.pop(model, None)
        finally:
            reloaded.set()
            if self.reloading.get(model) is reloaded:
                del self.reloading[model]

    async def settled(self, model: str) -> None:
        """Once the model's reload under way (if any) is over: a request
        that failed meanwhile learns whether its version could not load."""
        reloaded = self.reloading.get(model)
        if reloaded is not None:
            await reloaded.wait()

    def unready(self, model: str, version: str) -> str | None:
        """Why a version of the model cannot be served (None: it can, or is
        loaded by its next request): it failed to load, or the model's last
        load failed and named no version."""
        failed = self.failed_versions.get(model)
        if failed is None:
            return self.failures.get(model)
        return f"version {version} failed to load: {failed[version]}" if version in failed else None

    async def _failed(self, member: str, model: str, exc: Exception) -> None:
        """Record why the model's load on the member failed, and which of its versions failed there."""
        self.failures[model] = str(exc)
        try:
            self.failed_versions[model] = await self._unavailable(member, model)
        except (LoadError, UpstreamError) as error:
            log.warning("cannot read which versions of %s failed on %s: %s", model, member, error)
            self.failed_versions.pop(model, None)
        if not self.failed_versions.get(model):
            self.failed_versions.pop(model, None)

    async def forget(self, model: str) -> None:
        """The model is served no more: unloaded where it is held."""
        self.failures.pop(model, None)
        self.failed_versions.pop(model, None)
        self.sizes.pop(model, None)
        self.peaks.pop(model, None)
        for member in self.residency.forget(model):
            await self._unload(member, [model])

    @asynccontextmanager
    async def serving(self, model: str, requests: int = 1) -> AsyncIterator[str]:
        """The URL of a member holding the model (loaded first if none did);
        the model stays loaded while the block runs. requests: the callers'
        requests the block's call carries (joined ones count each: what
        makes a model hot)."""
        started = time.perf_counter()
        placement = await self._place(model, requests)
        if placement.spread:
            self._copy(placement.spread, model)
        key = (placement.member, model)
        try:
            if placement.load:
                try:
                    await self._cold(placement, model, key)
                except LoadError as exc:  # the service is unready with it (a copy's failure is not)
                    await self._failed(placement.member, model, exc)
                    raise
                except BaseException as exc:
                    self.failures[model] = str(exc)
                    raise
                self.cold_seconds.append(time.perf_counter() - started)
            elif key in self.pending:
                await asyncio.shield(self.pending[key])
            yield self.urls[placement.member]
        finally:
            # A model's first inference grows its member too (the backend's
            # buffers): measured again once that request is over.
            await self._end(placement, model, requests)

    async def _end(self, placement: Placement, model: str, requests: int = 1) -> None:
        self.residency.done(placement.member, model, requests)
        self._released.set()
        self._released = asyncio.Event()
        if placement.load or placement.member in self.over:
            await self._within_budget(placement.member)

    def _copy(self, placement: Placement, model: str) -> None:
        """Load a hot model's copy on another member, in the background: its
        requests go where it is loaded meanwhile."""
        async def load() -> None:
            try:
                await self._cold(placement, model, (placement.member, model))
            except Exception as exc:  # the model is still served where it was loaded
                log.warning("a copy of hot model %s could not be loaded on %s: %s", model, placement.member, exc)
            finally:
                await self._end(placement, model)

        task = asyncio.create_task(load())
        self.copies.add(task)
        task.add_done_callback(self.copies.discard)

    async def _place(self, model: str, requests: int) -> Placement:
        """Where the model's request goes; where no member has room because
        what they hold is in use, wait for a request to end (at most
        LOAD_TIMEOUT_SECONDS)."""
        deadline = time.monotonic() + LOAD_TIMEOUT_SECONDS
        while True:
            try:
                return self._placement_now(model, requests)
            except TooLarge:
                raise
            except NoRoom:
                if time.monotonic() > deadline:
                    raise
                released = self._released
                try:
                    await asyncio.wait_for(released.wait(), timeout=deadline - time.monotonic())
                except TimeoutError:
                    continue

    def _placement_now(self, model: str, requests: int) -> Placement:
        """Where the model's request goes as the members stand; NoRoom where none has room now."""
        if not self.residency.held(model):  # a cold load: place it by the members' memory now
            for member, held in self.residency.members.items():
                if not held.loading:  # mid-load a member's memory is neither before nor after its loads
                    self.residency.observe(member, self.used_mib(member))
        return self.residency.place(model, self._room(model), requests)

    async def _cold(self, placement: Placement, model: str, key: tuple[str, str]) -> None:
        done = asyncio.get_running_loop().create_future()
        done.add_done_callback(lambda f: f.exception())  # nobody else may be waiting: not an unretrieved error
        self.pending[key] = done
        try:
            measured = await self._load(placement, model)
        except BaseException as exc:
            self.residency.failed(placement.member, model)
            done.set_exception(exc if isinstance(exc, Exception) else LoadError("the load was cancelled"))
            raise
        finally:
            self.pending.pop(key, None)
        extra = self.residency.loaded(placement.member, model, measured)
        self.failures.pop(model, None)
        done.set_result(None)
        if extra:
            log.info("%s measured %.0f MiB on %s, more than its room: unloading %s", model, measured,
                     placement.member, ", ".join(extra))
            await self._unload(placement.member, extra)

    async def _within_budget(self, member: str) -> None:
        """Unload idle models, least recently used first, while the member's
        measured memory is over its budget less HEADROOM. The models' sizes are what each
        load grew the member by, but what they share (the first model on a
        member loads the backend's libraries, which stay while any model
        does) is not in any one size: the member's own measure decides.
        Where every model it holds is in use, the member is marked and
        checked again as their requests end."""
        budget = self.residency.members[member].budget_mib
        await self._unloads_over(member)  # a model on its way out is not what the member holds
        async with self.gates[member].shared():
            while self.used_mib(member) > budget:
                evicted = self.residency.evict_idle(member)
                if evicted is None:
                    self.over.add(member)
                    return
                await self._unload_locked(member, [evicted])
            self.over.discard(member)

    def restarted(self, member: str, empty_mib: float) -> None:
        """The member's server started again (its container restarted):
        it holds nothing, and uses empty_mib holding nothing."""
        gone = self.residency.emptied(member)
        self.empty[member] = empty_mib
        log.warning("pool member %s started again: it holds none of the %d models it held", member, len(gone))

    def memory(self, member: str) -> float:
        """The member's memory now (MiB)."""
        return sum(self.processes(member).values())

    def used_mib(self, member: str) -> float:
        """The member's memory over what it used holding no model."""
        return self.memory(member) - self.empty[member]

    async def _load(self, placement: Placement, model: str) -> float:
        """Load the model where placed, after the unloads that make room for
        it: its first load alone on the member and measured (its size), a
        load of a model measured before beside the member's other work."""
        member = placement.member
        self._unloading(member, placement.unload)
        try:
            # Outside the gate: the unload may be waiting to enter it behind a first load.
            await self._unloads_over(member, model)
            if model in self.sizes:
                async with self.gates[member].shared():
                    await self._unload_locked(member, placement.unload)
                    await self._loading(member, model)
                return self.sizes[model]
            async with self.gates[member].alone():
                await self._unload_locked(member, placement.unload)
                before = self.processes(member)
                peak = await self._peak_during(member, before, self._loading(member, model))
                measured = growth(before, self.processes(member))
        finally:
            self._unloaded(member, placement.unload)  # or never will be: nobody may wait for it
        self.peaks[model] = max(peak, measured)
        log.debug("loaded %s on %s: %.1f MiB before, peak +%.1f, settled +%.1f", model, member,
                  sum(before.values()) - self.empty[member], peak, measured)
        return self.sizes.setdefault(model, measured)

    async def _loading(self, member: str, model: str) -> None:
        """Load the model on the member; where some of its versions cannot
        load, load the others and keep the failed ones named (their
        service's canary is rolled back, as after a held model's reload)."""
        try:
            await self.repository.load(member, model)
        except LoadError:
            failed = await self._unavailable(member, model)
            narrowed = self._narrowed(model, failed)
            if narrowed is None:
                raise
            await self.repository.load(member, model, narrowed)
            log.warning("%s loaded on %s without its versions %s, which cannot load", model, member,
                        ", ".join(sorted(failed)))
            self.failed_versions[model] = failed
        else:
            self.failed_versions.pop(model, None)

    def _narrowed(self, model: str, failed: dict[str, str]) -> str | None:
        """The model's config serving its versions but the failed ones
        (None: no repository to read, nothing failed, or nothing left)."""
        if self.repository_dir is None or not failed:
            return None
        try:
            text = (self.repository_dir / model / "config.pbtxt").read_text()
        except OSError as exc:
            log.warning("cannot read the config of %s: %s", model, exc)
            return None
        return config_without(text, set(failed))

    async def _peak_during(self, member: str, before: dict[int, float], work: Awaitable[None]) -> float:
        """Do the work, measuring the member every PEAK_SECONDS meanwhile;
        the most it grew by since `before`."""
        task = asyncio.ensure_future(work)
        peak = 0.0
        while not task.done():
            await asyncio.wait({task}, timeout=PEAK_SECONDS)
            peak = max(peak, growth(before, self.processes(member)))
        await task
        return peak

    async def _unload(self, member: str, models: list[str] | tuple[str, ...]) -> None:
        self._unloading(member, models)
        try:
            async with self.gates[member].shared():
                await self._unload_locked(member, models)
        finally:
            self._unloaded(member, models)

    def _unloading(self, member: str, models: list[str] | tuple[str, ...]) -> None:
        """The models are to be unloaded from the member: their next load
        there waits for that (called before any await, as they leave the
        residency)."""
        for model in models:
            self.unloading.setdefault((member, model), asyncio.Event())

    def _unloaded(self, member: str, models: list[str] | tuple[str, ...]) -> None:
        for model in models:
            over = self.unloading.pop((member, model), None)
            if over is not None:
                over.set()

    async def _unloads_over(self, member: str, model: str | None = None) -> None:
        """Until the model's unload from the member (every unload there,
        where model is None) under way now is over. Never inside the
        member's gate: the unload may be waiting to enter it."""
        for (name, unloaded), over in list(self.unloading.items()):
            if name == member and model in (None, unloaded):
                await over.wait()

    async def _unload_locked(self, member: str, models: list[str] | tuple[str, ...]) -> None:
        """Unload, and wait until Triton no longer lists the models ready and
        their processes have gone: Triton answers an unload before the
        model's instances have gone (the python backend's stubs exit a second
        or so later), and until then their memory is not room for another
        load. A model served inside the server's process (no stub of its
        own) has gone once the memory of the member's processes as they were
        has fallen by about its size."""
        if not models:
            return
        self._unloading(member, models)
        try:
            before = self.processes(member)
            stubs = self._stubs_of(before, models)
            for model in models:
                await self.repository.unload(member, model)
            while await self._ready(member, models):
                await asyncio.sleep(0.02)
            if stubs:
                await self._exited(member, stubs)
            else:
                await self._fallen(member, before, 0.5 * sum(self._fall(m) for m in models))
            log.debug("unloaded %s from %s: %.1f MiB before, %.1f after", ", ".join(models), member,
                      sum(before.values()) - self.empty[member], self.used_mib(member))
        finally:
            self._unloaded(member, models)

    def _stubs_of(self, processes: dict[int, float], models: list[str] | tuple[str, ...]) -> set[int]:
        """The python-backend stubs of the models among the processes; none
        unless each model has its own (where one has none, its memory is in
        the server's process, and only the memory's fall tells it has gone)."""
        stubs = self.stubs(processes)
        if not set(models) <= set(stubs.values()):
            return set()
        return {pid for pid, model in stubs.items() if model in models}

    async def _exited(self, member: str, stubs: set[int]) -> None:
        """Wait until the stubs are no longer among the member's processes.
        Not for its memory to fall by what they used: the stubs of the
        models it keeps map the same libraries, and what they shared with
        the leaving ones becomes theirs alone."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while left := stubs & self.processes(member).keys():
            if time.monotonic() > deadline:
                log.warning("pool member %s's unloaded models' processes %s still run %.0f s after their unload",
                            member, sorted(left), SETTLE_SECONDS)
                return
            await asyncio.sleep(0.05)

    def _fall(self, model: str) -> float:
        """What the member's memory falls by once the model is unloaded: its
        size, or a typical model's where that is less (a member's first load
        also grew it by the backend's libraries, which stay while it holds
        any model)."""
        typical = statistics.median(self.sizes.values()) if self.sizes else self.estimate_mib
        return min(self._size(model), typical)

    async def _fallen(self, member: str, before: dict[int, float], fall: float) -> None:
        """Wait until the processes the member had before an unload use
        `fall` MiB less (the unloaded models' processes are exiting; the
        processes of loads started since are not counted), then until they
        stop falling (they are gone): what is left of them must not be
        counted as free room for the next load."""
        def now() -> float:
            return sum(mib for pid, mib in self.processes(member).items() if pid in before)

        deadline, below = time.monotonic() + SETTLE_SECONDS, sum(before.values()) - fall
        while (left := now()) > below:
            if time.monotonic() > deadline:
                log.warning("pool member %s's processes still use %.0f MiB %.0f s after an unload (expected under "
                            "%.0f MiB)", member, left, SETTLE_SECONDS, below)
                return
            await asyncio.sleep(0.05)
        while time.monotonic() < deadline:
            await asyncio.sleep(STILL_SECONDS)
            left, earlier = now(), left
            if left > earlier - 1.0:
                return

    async def _ready(self, member: str, models: list[str] | tuple[str, ...]) -> list[str]:
        ready = {entry.get("name") for entry in await self.repository.index(member) if entry.get("state") == "READY"}
        return [m for m in models if m in ready]

    async def _unavailable(self, member: str, model: str) -> dict[str, str]:
        """The model's versions the member lists as failed, with Triton's
        reasons: unavailable for another reason than having been unloaded
        (the versions a failed load unloads again, or that left the config)."""
        return {str(entry.get("version")): entry.get("reason", "") for entry in await self.repository.index(member)
                if entry.get("name") == model and entry.get("state") == "UNAVAILABLE"
                and entry.get("reason") != UNLOADED}

    def measured(self) -> dict[str, float]:
        """Model -> the room its next load gets, for every model loaded once."""
        return {model: self._room(model) for model in self.sizes.keys() | self.peaks.keys()}

    def _size(self, model: str) -> float:
        return self.sizes.get(model, self.estimate_mib)

    def _room(self, model: str) -> float:
        """The room a load of the model needs: the most its last load grew
        the member by (a load's processes use more while they start than once
        loaded), else its first load's growth; for a model never loaded, the estimate
        given, else the median of the loads measured so far. Before any
        load is measured, the first goes alone: NoRoom (wait) while it runs."""
        if model in self.peaks or model in self.sizes:
            return max(self.peaks.get(model, 0.0), self.sizes.get(model, 0.0))
        if self.estimate_mib or self.peaks:
            return self.estimate_mib or statistics.median(self.peaks.values())
        if self.pending:
            raise NoRoom("the pool's first load is being measured")
        return 0.0

    async def close(self) -> None:
        for task in self.copies:
            task.cancel()
        await self.repository.close()
