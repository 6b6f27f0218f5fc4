"""A bounded-staleness cache: an entry older than `ttl` seconds is re-read from the store.

This is how revocation, expiry changes and membership changes reach every gateway process:
no process serves a decision older than `ttl` (0.5 s by default, under the 1 s promise),
without any cross-process channel. The process that makes a change also drops its own entry.

While the store cannot be reached, `last_known` still answers from an entry up to `outage_grace`
seconds old: no key can be revoked or changed while the database is down either, so the last
answer is still the truth, and traffic of keys seen recently keeps flowing through the outage.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

MISS: Any = object()


class TtlCache:
    def __init__(self, ttl: float, max_size: int = 100_000) -> None:
        self.ttl = ttl
        self._max = max_size
        self._data: dict[Hashable, tuple[float, Any]] = {}

    def get(self, key: Hashable, now: float) -> Any:
        """The value (None included, for negative entries), or MISS when absent or stale."""
        entry = self._data.get(key)
        if entry is None or now - entry[0] >= self.ttl:
            return MISS
        return entry[1]

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
        self._data.pop(key, None)

    def clear(self) -> None:
        self._data.clear()
