"""How long a pool waits after an unload, and who may work on a member at once
(kubeloop.front.pool, kubeloop.front.gate). Unit: a member's processes and
Triton's repository API are plain data here (the pool front's own code,
alike on the local and cluster backends); against real tritonservers the
same is proven in tests/components/test_pool.py. Where the pool is not
told a model's stub (NO_STUBS), it judges the unload by the fall of the
member's memory, as for a model served in the server's own process."""

from __future__ import annotations

import asyncio
import logging

from kubeloop.front.gate import Gate
from kubeloop.front.modelcontrol import Member
from kubeloop.front.pool import Pool

SERVER, LIBRARIES, MODEL = 1, 29.0, 26.0


def NO_STUBS(_pids) -> dict[int, str]:  # noqa: ANN001, N802 - a stand-in for kubeloop.front.memory.python_stubs
    return {}


class Member_:
    """A python-backend member: the server process (which keeps the backend's
    libraries once its first model loaded them) and a process per model,
    which exits a moment after its unload is answered."""

    def __init__(self, models: list[str], shared: float = 0.0):
        self.pids = {model: 100 + i for i, model in enumerate(models)}
        self.memory = {SERVER: 40.0 + LIBRARIES, **{pid: MODEL for pid in self.pids.values()}}
        self.ready = set(models)
        self.shared = shared
        """What each other process's private memory rises by as one exits (pages they shared)."""

    async def unload(self, _member: str, model: str) -> None:
        self.ready.discard(model)
        asyncio.get_running_loop().call_later(0.1, self._exit, self.pids[model])

    def _exit(self, pid: int) -> None:
        self.memory.pop(pid)
        for other in self.memory.keys() - {SERVER}:
            self.memory[other] += self.shared

    def stubs(self, pids) -> dict[int, str]:  # noqa: ANN001 - the pool's process ids
        return {pid: model for model, pid in self.pids.items() if pid in pids}

    async def index(self, _member: str) -> list[dict]:
        return [{"name": model, "state": "READY"} for model in self.ready]

    async def close(self) -> None:
        return None


def test_unloading_the_model_whose_first_load_brought_the_libraries_waits_for_what_it_frees(caplog):
    """Its measured size holds the libraries, which stay while the member
    holds any model: the pool waits for its own process to go (a typical
    model's fall), not for a fall that never comes (it waited 10 s and
    warned, holding up the member's next load)."""
    member = Member_(["first", "second", "third"])

    async def scenario() -> None:
        pool = Pool({"a": Member("http://127.0.0.1:1", "127.0.0.1:2")}, {"a": 1e3}, lambda _name: dict(member.memory),
                    stubs=NO_STUBS)
        pool.repository = member
        pool.sizes = {"first": LIBRARIES + MODEL, "second": MODEL, "third": MODEL}
        await pool._unload("a", ["first"])
        assert member.pids["first"] not in member.memory

    with caplog.at_level(logging.WARNING, logger="kubeloop.pool"):
        asyncio.run(scenario())
    assert not caplog.records, caplog.text


def test_an_unload_is_judged_by_the_processes_it_had_not_by_a_load_beside_it(caplog):
    """A load started after the unload grows the member meanwhile (its new
    process): the unload still sees its own model's process go."""
    member = Member_(["first", "second"])

    async def scenario() -> None:
        pool = Pool({"a": Member("http://127.0.0.1:1", "127.0.0.1:2")}, {"a": 1e3}, lambda _name: dict(member.memory),
                    stubs=NO_STUBS)
        pool.repository = member
        pool.sizes = {"first": MODEL, "second": MODEL}
        asyncio.get_running_loop().call_later(0.05, member.memory.__setitem__, 999, 2 * MODEL)
        await pool._unload("a", ["second"])

    with caplog.at_level(logging.WARNING, logger="kubeloop.pool"):
        asyncio.run(scenario())
    assert not caplog.records, caplog.text


def test_an_unload_ends_once_its_stub_has_gone_though_the_survivors_memory_rises(caplog):
    """The kept model's stub takes over the pages it shared with the one
    unloaded: the member's memory falls by less than the model measured,
    and only the stub's exit says the unload is over."""
    member = Member_(["kept", "unloaded"], shared=0.8 * MODEL)

    async def scenario() -> None:
        pool = Pool({"a": Member("http://127.0.0.1:1", "127.0.0.1:2")}, {"a": 1e3}, lambda _name: dict(member.memory),
                    stubs=member.stubs)
        pool.repository = member
        pool.sizes = {"kept": LIBRARIES + MODEL, "unloaded": MODEL}
        await pool._unload("a", ["unloaded"])
        assert member.pids["unloaded"] not in member.memory

    with caplog.at_level(logging.WARNING, logger="kubeloop.pool"):
        asyncio.run(scenario())
    assert not caplog.records, caplog.text


def test_shared_work_goes_together_and_alone_work_by_itself_before_later_shared_work():
    async def scenario() -> list[str]:
        gate, events, running = Gate(), [], set()

        async def work(name: str, alone: bool) -> None:
            async with (gate.alone() if alone else gate.shared()):
                running.add(name)
                events.append("+".join(sorted(running)))
                await asyncio.sleep(0.01)
                running.discard(name)

        first = [asyncio.create_task(work(name, False)) for name in ("a", "b")]
        await asyncio.sleep(0)  # a and b are in
        later = [asyncio.create_task(work("measure", True)), asyncio.create_task(work("c", False))]
        await asyncio.gather(*first, *later)
        return events

    assert asyncio.run(scenario()) == ["a", "a+b", "measure", "c"]


def test_a_cancelled_alone_wait_lets_shared_work_in():
    async def scenario() -> bool:
        gate = Gate()
        async with gate.shared():
            waiting = asyncio.create_task(_enter(gate.alone()))
            await asyncio.sleep(0)
            blocked = asyncio.create_task(_enter(gate.shared()))
            await asyncio.sleep(0.01)
            assert not blocked.done()  # held back for the alone work waiting
            waiting.cancel()
            await asyncio.wait_for(blocked, timeout=1)
        return blocked.done()

    assert asyncio.run(scenario())


async def _enter(context) -> None:  # noqa: ANN001 - one of the gate's context managers
    async with context:
        pass
