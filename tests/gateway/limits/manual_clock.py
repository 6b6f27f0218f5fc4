"""A clock the tests move by hand (no sleeps). Holds integer µs so retry arithmetic is exact."""

from __future__ import annotations

from datetime import UTC, datetime

START = datetime(2025, 3, 14, 12, 0, 0, tzinfo=UTC)  # where every limiter test's clock starts


class ManualClock:
    def __init__(self, start: datetime):
        self.us = int(start.timestamp()) * 1_000_000 + start.microsecond

    def __call__(self) -> float:
        return self.us / 1_000_000

    def advance(self, seconds: float) -> None:
        self.us += round(seconds * 1_000_000)

    def advance_us(self, us: int) -> None:
        self.us += us
