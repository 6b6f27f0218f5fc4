"""`merge` closes the streams it reads the moment it is closed itself: each one holds a worker connection, and
one left for the garbage collector keeps the worker generating for a client that is gone."""

from __future__ import annotations

from gateway.collect import merge


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
