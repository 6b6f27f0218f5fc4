"""A bounded-staleness cache: an entry older than `ttl` seconds is re-read from the store.

This is how revocation, expiry changes and membership changes reach every gateway process:
no process serves a decision older than `ttl` (0.5 s by default, under the 1 s promise),
without any cross-process channel. The process that makes a change also drops its own entry.

Under load a hot entry must not expire for everyone at once: every request in flight would miss together
and queue its own store read (on SQLite, one thread fighting the busy event loop for the GIL: a third of a
second, every `ttl`, was the gateway's p99). So reads are shared: requests that miss the same entry together
wait for one read (`load`), and an entry past half its `ttl` is re-read in the background while it still
answers (`refresh`). The staleness bound is unchanged: an entry is stamped with the time its read began,
and past `ttl` it answers nobody.

While the store cannot be reached, `last_known` still answers from an entry up to `outage_grace`
seconds old: no key can be revoked or changed while the database is down either, so the last
answer is still the truth, and traffic of keys seen recently keeps flowing through the outage.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

MISS: Any = object()
REFRESH_AT = 0.5  # of ttl: an entry this old is re-read in the background, so a hot one never expires


class TtlCache:
    def __init__(self, ttl: float, max_size: int = 100_000) -> None:
        self.ttl = ttl
        self._max = max_size
        self._data: dict[Hashable, tuple[float, Any]] = {}
        self._reads: dict[Hashable, asyncio.Task[Any]] = {}  # the store read under way per key, shared by its waiters

    def get(self, key: Hashable, now: float) -> Any:
        """The value (None included, for negative entries), or MISS when absent or stale."""
        entry = self._data.get(key)
        if entry is None or now - entry[0] >= self.ttl:
            return MISS
        return entry[1]

    def due(self, key: Hashable, now: float) -> bool:
        """An entry past REFRESH_AT of its ttl, to be re-read while it still answers."""
        entry = self._data.get(key)
        return entry is not None and now - entry[0] >= self.ttl * REFRESH_AT

    async def load(self, key: Hashable, now: float, read: Callable[[], Awaitable[Any]]) -> Any:
        """The store's answer for `key` (`read()`), cached as of `now`; requests that miss together share
        one read. A waiter that is cancelled leaves the read to the others."""
        return await asyncio.shield(self._read(key, now, read))

    def refresh(self, key: Hashable, now: float, read: Callable[[], Awaitable[Any]]) -> None:
        """Re-read `key` in the background unless a read is under way; a failed one leaves the entry as it
        was (it still expires at its ttl; the next request then reads, or falls back to `last_known`)."""
        if key not in self._reads:
            self._read(key, now, read).add_done_callback(_retrieved)

    def _read(self, key: Hashable, now: float, read: Callable[[], Awaitable[Any]]) -> asyncio.Task[Any]:
        task = self._reads.get(key)
        if task is None:
            task = self._reads[key] = asyncio.get_running_loop().create_task(self._keep(key, now, read))
        return task

    async def _keep(self, key: Hashable, now: float, read: Callable[[], Awaitable[Any]]) -> Any:
        try:
            value = await read()
            if self._reads.get(key) is asyncio.current_task():  # not forgotten while it read: a change wins
                self.put(key, value, now)
            return value
        finally:
            if self._reads.get(key) is asyncio.current_task():
                del self._reads[key]

    def last_known(self, key: Hashable, now: float, outage_grace: float) -> Any:
        """The value however stale, up to `outage_grace` seconds old (for a store outage), else MISS."""
        entry = self._data.get(key)
        if entry is None or now - entry[0] >= outage_grace:
            return MISS
        return entry[1]

    def put(self, key: Hashable, value: Any, now: float) -> None:
        data = self._data
        data.pop(key, None)
        if len(data) >= self._max:
            del data[next(iter(data))]  # evict the oldest insertion: a cheap bound on memory
        data[key] = (now, value)

    def forget(self, key: Hashable) -> None:
        """Drop `key`, and a read of it under way: that read may predate the change that made us forget."""
        self._data.pop(key, None)
        self._reads.pop(key, None)

    def clear(self) -> None:
        self._data.clear()
        self._reads.clear()


def _retrieved(task: asyncio.Task[Any]) -> None:
    """A background read's failure is expected (the store is down) and already handled: mark it seen."""
    if not task.cancelled():
        task.exception()
