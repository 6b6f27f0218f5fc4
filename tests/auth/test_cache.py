"""The auth cache shares its store reads: requests that miss together wait for one read, and a hot entry is
re-read in the background before it expires, without loosening the staleness bound."""

from __future__ import annotations

import asyncio
import gc

from auth.cache import MISS, TtlCache
from common.errors import StoreUnavailable


class Reader:
    """A store read the test holds open until it says so; counts how often it was asked."""

    def __init__(self, value: object = "fresh", error: Exception | None = None) -> None:
        self.value, self.error = value, error
        self.calls = 0
        self.release = asyncio.Event()

    async def __call__(self) -> object:
        self.calls += 1
        await self.release.wait()
        if self.error is not None:
            raise self.error
        return self.value


async def _started(*tasks: asyncio.Task) -> None:
    await asyncio.sleep(0)  # every waiter reached the read
    assert not any(task.done() for task in tasks)


async def test_requests_that_miss_together_share_one_read():
    cache, read = TtlCache(0.5), Reader()
    waiters = [asyncio.create_task(cache.load("k", 10.0, read)) for _ in range(32)]
    await _started(*waiters)
    read.release.set()
    assert await asyncio.gather(*waiters) == ["fresh"] * 32
    assert read.calls == 1
    assert cache.get("k", 10.4) == "fresh"


async def test_a_failed_read_fails_every_waiter_and_the_next_miss_reads_again():
    cache, failing = TtlCache(0.5), Reader(error=StoreUnavailable("down"))
    waiters = [asyncio.create_task(cache.load("k", 10.0, failing)) for _ in range(3)]
    await _started(*waiters)
    failing.release.set()
    for outcome in await asyncio.gather(*waiters, return_exceptions=True):
        assert isinstance(outcome, StoreUnavailable)
    assert failing.calls == 1 and cache.get("k", 10.0) is MISS
    read = Reader()
    read.release.set()
    assert await cache.load("k", 10.1, read) == "fresh" and read.calls == 1


async def test_a_cancelled_waiter_leaves_the_read_to_the_others():
    cache, read = TtlCache(0.5), Reader()
    first = asyncio.create_task(cache.load("k", 10.0, read))
    second = asyncio.create_task(cache.load("k", 10.0, read))
    await _started(first, second)
    first.cancel()  # its client left
    await asyncio.sleep(0)
    read.release.set()
    assert await second == "fresh"
    assert first.cancelled() and read.calls == 1 and cache.get("k", 10.0) == "fresh"


async def test_a_read_under_way_when_the_entry_is_forgotten_is_not_cached():
    """A revocation in this process forgets the key: a read that began before it may hold the old answer,
    so it answers only its own waiters, and the next request reads again."""
    cache, old = TtlCache(0.5), Reader("before the change")
    before = asyncio.create_task(cache.load("k", 10.0, old))
    await _started(before)
    cache.forget("k")
    new = Reader("after the change")
    after = asyncio.create_task(cache.load("k", 10.0, new))
    await _started(after)
    old.release.set()
    assert await before == "before the change"
    assert cache.get("k", 10.0) is MISS
    new.release.set()
    assert await after == "after the change" and cache.get("k", 10.0) == "after the change"


async def test_an_entry_past_half_its_ttl_answers_and_is_reread_in_the_background():
    cache = TtlCache(0.5)
    cache.put("k", "old", 10.0)
    assert not cache.due("k", 10.24) and cache.due("k", 10.25) and not cache.due("absent", 10.25)
    read = Reader("new")
    cache.refresh("k", 10.3, read)
    cache.refresh("k", 10.35, read)  # one read at a time
    await asyncio.sleep(0)
    assert read.calls == 1 and cache.get("k", 10.4) == "old"  # answering while it reads
    read.release.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert cache.get("k", 10.79) == "new"  # stamped when its read began (10.3)
    assert cache.get("k", 10.8) is MISS  # so the bound holds: never older than ttl


async def test_an_entry_past_its_ttl_is_a_miss_even_while_a_refresh_reads():
    cache = TtlCache(0.5)
    cache.put("k", "old", 10.0)
    read = Reader("new")
    cache.refresh("k", 10.3, read)
    assert cache.get("k", 10.5) is MISS
    waiter = asyncio.create_task(cache.load("k", 10.5, read))  # joins the read under way
    await _started(waiter)
    read.release.set()
    assert await waiter == "new" and read.calls == 1


async def test_a_failed_background_read_keeps_the_entry_and_warns_nobody():
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        cache = TtlCache(0.5)
        cache.put("k", "old", 10.0)
        failing = Reader(error=StoreUnavailable("down"))
        failing.release.set()
        cache.refresh("k", 10.3, failing)
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()  # an unretrieved task exception is reported when the task is collected
        assert failing.calls == 1 and cache.get("k", 10.4) == "old" and reported == []
        read = Reader("new")
        read.release.set()
        cache.refresh("k", 10.4, read)  # the failed read is no longer under way: the next one starts
        for _ in range(3):
            await asyncio.sleep(0)
        assert read.calls == 1 and cache.get("k", 10.5) == "new"
    finally:
        loop.set_exception_handler(None)


async def test_clear_drops_entries_and_reads_under_way():
    cache, read = TtlCache(0.5), Reader()
    cache.put("other", 1, 10.0)
    waiter = asyncio.create_task(cache.load("k", 10.0, read))
    await _started(waiter)
    cache.clear()
    read.release.set()
    assert await waiter == "fresh"
    assert cache.get("k", 10.0) is MISS and cache.get("other", 10.0) is MISS
