"""Time source. A clock is any zero-argument callable returning seconds since the Unix epoch (UTC),
like ``time.time``; tests inject a controllable one. Limiters work in integer microseconds so that a
Retry-After computed from the log is exact, not subject to float drift."""

from __future__ import annotations

import time
from collections.abc import Callable

Clock = Callable[[], float]


def to_us(seconds: float) -> int:
    return round(seconds * 1_000_000)


class MonotonicWall:
    """Wraps a wall clock so it never goes backwards (NTP steps would otherwise reorder the log)."""

    __slots__ = ("_clock", "_last")

    def __init__(self, clock: Clock | None = None):
        self._clock = clock or time.time
        self._last = 0

    def now_us(self) -> int:
        now = round(self._clock() * 1_000_000)
        if now < self._last:
            return self._last
        self._last = now
        return now
