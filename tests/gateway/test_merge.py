"""`merge` closes the streams it reads the moment it is closed itself: each one holds a worker connection, and
one left for the garbage collector keeps the worker generating for a client that is gone."""

from __future__ import annotations

import pytest

from common.protocol import Finish
from gateway.collect import merge
from gateway.dialects.base import DEFAULT
from gateway.errors import GenerationFailed
from gateway.generation import honest


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
