"""`merge` closes the streams it reads the moment it is closed itself: each one holds a worker connection, and
one left for the garbage collector keeps the worker generating for a client that is gone. `honest` (a stream's
events) and `collect_answer` (a collected answer's) fail a failed choice and close their streams too; a collected
answer is bounded by its limit, and a cancel from outside stays a cancel."""

from __future__ import annotations

import asyncio

import pytest

from common.protocol import Finish, Token
from gateway.errors import GenerationFailed, RequestTimedOut
from gateway.serving.answer import collect_answer, honest
from gateway.serving.collect import merge
from gateway.serving.dialect import DEFAULT


def events(closed: list[int], index: int):
    async def stream():
        try:
            for n in range(100):
                yield n
        finally:
            closed.append(index)

    return stream()


async def test_closing_the_merge_closes_a_single_stream_at_once():
    closed: list[int] = []
    streams = [events(closed, 0)]  # still referenced here: only an explicit close can run its finally
    merged = merge(streams)
    assert await anext(merged) == (0, 0)
    await merged.aclose()
    assert closed == [0]


async def test_closing_the_merge_closes_every_stream_at_once():
    closed: list[int] = []
    streams = [events(closed, 0), events(closed, 1)]
    merged = merge(streams)
    await anext(merged)
    await merged.aclose()
    assert sorted(closed) == [0, 1]


async def test_closing_a_requests_events_closes_its_single_stream_at_once():
    """`honest` reads one worker stream without `merge` in between: it must close it as promptly."""
    closed: list[int] = []
    streams = [events(closed, 0)]
    checked = honest(DEFAULT, streams)
    assert await anext(checked) == (0, 0)
    await checked.aclose()
    assert closed == [0]


async def test_a_failed_choice_fails_the_request_and_closes_its_streams():
    closed: list[int] = []

    async def failing(index: int):
        try:
            yield Finish(index=0, reason="error", text="", token_ids=[], seed=0)
        finally:
            closed.append(index)

    for streams in ([failing(0)], [failing(0), failing(1)]):
        closed.clear()
        with pytest.raises(GenerationFailed, match="structured-output grammar"):
            async for _ in honest(DEFAULT, streams):
                pass
        assert sorted(closed) == list(range(len(streams)))


def answer(closed: list[int], index: int, pause_s: float = 0.0, reason: str = "length"):
    async def stream():
        try:
            yield Token(index=0, token_id=1, text="a")
            await asyncio.sleep(pause_s)
            yield Finish(index=0, reason=reason, text="a", token_ids=[1], seed=0)
        finally:
            closed.append(index)

    return stream()


@pytest.mark.parametrize("count", [1, 2])
async def test_a_collected_answer_gathers_each_streams_events_and_closes_them(count):
    closed: list[int] = []
    seen = []
    results = await collect_answer(DEFAULT, [answer(closed, i) for i in range(count)], seen.append, 5.0)
    assert [r.ordered()[0].finish.reason for r in results] == ["length"] * count
    assert len(seen) == 2 * count and sorted(closed) == list(range(count))


@pytest.mark.parametrize("count", [1, 2])
async def test_a_collected_answer_past_its_limit_is_timed_out_and_lets_its_streams_go(count):
    closed: list[int] = []
    with pytest.raises(RequestTimedOut, match="request_timeout_s"):
        await collect_answer(DEFAULT, [answer(closed, i, pause_s=30) for i in range(count)], lambda event: None, 0.05)
    assert sorted(closed) == list(range(count))
    assert asyncio.current_task().cancelling() == 0  # its own cancel was taken back


async def test_a_collected_answer_cancelled_from_outside_stays_cancelled():
    """A client's disconnect cancels the request's task: that is a cancel, never the limit's 504."""
    closed: list[int] = []
    task = asyncio.create_task(collect_answer(DEFAULT, [answer(closed, 0, pause_s=30)], lambda event: None, 5.0))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert closed == [0]


@pytest.mark.parametrize("count", [1, 2])
async def test_a_failed_choice_fails_a_collected_answer(count):
    closed: list[int] = []
    with pytest.raises(GenerationFailed, match="structured-output grammar"):
        await collect_answer(DEFAULT, [answer(closed, i, reason="error") for i in range(count)], lambda event: None,
                             5.0)
    assert sorted(closed) == list(range(count))
