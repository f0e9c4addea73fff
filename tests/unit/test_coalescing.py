"""Requests waiting for a call are served together: entity requests
waiting for the online store (a fake read in a thread, as the router runs
Feast's) and requests of one kind only (local and cluster routers run the
same code)."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from kubeloop.front.coalescing import Coalescer
from kubeloop.front.features import RequestError, concat_rows


def _echo(requests):  # noqa: ANN001, ANN202 - a joined read: each row's value is its card
    joined, spans = concat_rows(requests)
    return [joined["card_id"][a:b] for a, b in spans]


def _reading(read_many, pool, **limits) -> Coalescer:  # noqa: ANN001 - how the router reads a store
    loop = asyncio.get_running_loop()
    return Coalescer(lambda requests: loop.run_in_executor(pool, read_many, requests),
                     rows=lambda columns: len(columns["card_id"]), waiting_for="the online store", **limits)


def test_rows_are_joined_and_each_request_gets_its_own_back():
    joined, spans = concat_rows([{"card_id": [1, 2], "hour": [3, 4]}, {"card_id": [5], "hour": [6]}])
    assert joined == {"card_id": [1, 2, 5], "hour": [3, 4, 6]} and spans == [(0, 2), (2, 3)]
    assert _echo([{"card_id": [1, 2]}, {"card_id": [5]}]) == [[1, 2], [5]]


def test_requests_arriving_during_a_read_share_the_next_one():
    release = threading.Event()
    calls: list[int] = []

    def read_many(requests):  # noqa: ANN001, ANN202
        calls.append(len(requests))
        if len(calls) == 1:
            release.wait(timeout=10)
        return _echo(requests)

    async def go():
        with ThreadPoolExecutor(1) as pool:
            coalescer = _reading(read_many, pool)
            first = asyncio.ensure_future(coalescer.submit({"card_id": [0]}))
            while not calls:
                await asyncio.sleep(0.001)
            rest = [asyncio.ensure_future(coalescer.submit({"card_id": [k, k]})) for k in range(1, 9)]
            await asyncio.sleep(0.01)
            release.set()
            return await first, await asyncio.gather(*rest), coalescer.calls

    first, rest, reads = asyncio.run(go())
    assert calls == [1, 8] and reads == 2
    assert first == [0] and rest == [[k, k] for k in range(1, 9)]


def test_a_read_takes_at_most_max_rows_and_the_rest_wait_for_the_next():
    calls: list[list[int]] = []

    def read_many(requests):  # noqa: ANN001, ANN202
        calls.append([len(r["card_id"]) for r in requests])
        return _echo(requests)

    async def go():
        with ThreadPoolExecutor(1) as pool:
            coalescer = _reading(read_many, pool, max_rows=4)
            return await asyncio.gather(*(coalescer.submit({"card_id": [k, k, k]}) for k in range(3)))

    answers = asyncio.run(go())
    assert calls == [[3], [3], [3]] and answers == [[k] * 3 for k in range(3)]


def test_a_failed_read_fails_every_request_it_served_and_the_next_read_runs():
    release = threading.Event()
    failures = iter([None, RuntimeError("redis went away")])

    def read_many(requests):  # noqa: ANN001, ANN202 - the first read holds the next two back
        failure = next(failures, None)
        if failure:
            raise failure
        release.wait(timeout=10)
        return _echo(requests)

    async def go():
        with ThreadPoolExecutor(1) as pool:
            coalescer = _reading(read_many, pool)
            first = asyncio.ensure_future(coalescer.submit({"card_id": [0]}))
            await asyncio.sleep(0)
            joined = asyncio.gather(coalescer.submit({"card_id": [1]}), coalescer.submit({"card_id": [2]}),
                                    return_exceptions=True)
            await asyncio.sleep(0)
            release.set()
            return await first, await joined, await coalescer.submit({"card_id": [3]})

    first, failed, later = asyncio.run(go())
    assert first == [0]
    assert [str(f) for f in failed] == ["redis went away"] * 2 and later == [3]


def test_a_lone_request_is_served_in_its_own_task_and_counts_as_a_call():
    """Nothing waits and nothing is under way: no task of the coalescer's
    own (the router's answer at concurrency 1 waited a turn of the loop for it)."""
    async def go():
        tasks: list[asyncio.Task] = []

        async def serve_many(items):  # noqa: ANN001, ANN202
            tasks.append(asyncio.current_task())
            return [item.upper() for item in items]

        coalescer = Coalescer(serve_many, rows=len, waiting_for="Triton")
        answers = [await coalescer.submit(item) for item in ("a", "b")]
        return answers, tasks == [asyncio.current_task()] * 2, coalescer.calls, coalescer.busy

    assert asyncio.run(go()) == (["A", "B"], True, 2, 0)


def test_beyond_max_waiting_a_request_is_refused_with_503_and_counted():
    release, reading = threading.Event(), threading.Event()
    refused: list[int] = []

    def read_many(requests):  # noqa: ANN001, ANN202
        reading.set()
        release.wait(timeout=10)
        return _echo(requests)

    async def go():
        with ThreadPoolExecutor(1) as pool:
            coalescer = _reading(read_many, pool, on_refused=lambda: refused.append(1), max_waiting=2)
            held = [asyncio.ensure_future(coalescer.submit({"card_id": [0]}))]
            await asyncio.to_thread(reading.wait, 10)  # the first is being read
            held += [asyncio.ensure_future(coalescer.submit({"card_id": [k]})) for k in (1, 2)]
            await asyncio.sleep(0)  # two wait
            with pytest.raises(RequestError) as error:
                await coalescer.submit({"card_id": [9]})
            release.set()
            await asyncio.gather(*held)
            return error.value

    error = asyncio.run(go())
    assert error.status == 503 and "2 requests already wait for the online store" in str(error) and refused == [1]


def test_a_call_carries_every_waiting_request_of_one_kind_in_the_order_they_came():
    calls: list[list[str]] = []

    async def go():
        opened = asyncio.Event()

        async def serve_many(items):  # noqa: ANN001, ANN202
            calls.append(items)
            await opened.wait()
            return [item.upper() for item in items]

        coalescer = Coalescer(serve_many, rows=len, waiting_for="Triton", kind=lambda item: item[0])
        first = asyncio.ensure_future(coalescer.submit("a1"))
        while not calls:
            await asyncio.sleep(0)
        rest = [asyncio.ensure_future(coalescer.submit(item)) for item in ("a2", "b1", "a3", "b2", "a4")]
        await asyncio.sleep(0)
        opened.set()
        return await first, await asyncio.gather(*rest)

    first, rest = asyncio.run(go())
    assert calls == [["a1"], ["a2", "a3", "a4"], ["b1", "b2"]]
    assert (first, rest) == ("A1", ["A2", "B1", "A3", "B2", "A4"])


def test_a_call_that_answers_too_few_fails_its_requests_instead_of_leaving_one_waiting():
    async def go():
        opened = asyncio.Event()

        async def serve_many(items):  # noqa: ANN001, ANN202 - the first call holds the next two back
            await opened.wait()
            return items[:-1]

        coalescer = Coalescer(serve_many, rows=len, waiting_for="Triton")
        alone = asyncio.ensure_future(coalescer.submit("a"))
        await asyncio.sleep(0)
        joined = asyncio.gather(coalescer.submit("b"), coalescer.submit("c"), return_exceptions=True)
        await asyncio.sleep(0)
        opened.set()
        answers = await asyncio.wait_for(asyncio.gather(alone, joined, return_exceptions=True), timeout=5)
        return [str(answers[0]), [str(r) for r in answers[1]]]

    assert asyncio.run(go()) == ["0 answers for 1 requests", ["1 answers for 2 requests"] * 2]


def test_the_next_call_starts_before_the_callers_of_the_last_one_are_answered():
    """Triton sat idle while the router answered a joined call's callers."""
    events: list[str] = []

    async def go():
        held = {"a": asyncio.Event(), "b": asyncio.Event()}

        async def serve_many(items):  # noqa: ANN001, ANN202
            events.append(f"call {''.join(items)}")
            if items[0] in held:
                await held[items[0]].wait()
            return items

        async def caller(item: str) -> None:
            await coalescer.submit(item)
            events.append(f"answered {item}")

        coalescer = Coalescer(serve_many, rows=len, waiting_for="Triton")
        callers = [asyncio.ensure_future(caller("a"))]
        await asyncio.sleep(0)
        callers += [asyncio.ensure_future(caller(item)) for item in "bc"]
        await asyncio.sleep(0)
        held["a"].set()
        while "call bc" not in events:
            await asyncio.sleep(0)
        callers.append(asyncio.ensure_future(caller("d")))
        await asyncio.sleep(0)
        held["b"].set()
        await asyncio.gather(*callers)

    asyncio.run(go())
    assert events[events.index("call bc"):] == ["call bc", "call d", "answered b", "answered c", "answered d"]


def test_items_that_follow_each_other_share_a_call_even_when_nothing_is_under_way():
    """The requests of one joined read reach Triton's coalescer in one turn of
    the event loop: going alone, the first took a call of its own."""
    calls: list[list[int]] = []

    async def serve_many(items):  # noqa: ANN001, ANN202
        calls.append(list(items))
        await asyncio.sleep(0)
        return [item * 10 for item in items]

    async def go(alone: bool):
        calls.clear()
        coalescer = Coalescer(serve_many, rows=lambda _: 1, waiting_for="Triton")
        answers = await asyncio.gather(*(coalescer.submit(k, alone=alone) for k in range(4)))
        return answers, list(calls)

    assert asyncio.run(go(alone=False)) == ([0, 10, 20, 30], [[0, 1, 2, 3]])
    assert asyncio.run(go(alone=True)) == ([0, 10, 20, 30], [[0], [1, 2, 3]])
