"""UTC calendar months, in integer microseconds: monthly budgets reset on the first of the month, 00:00 UTC."""

from __future__ import annotations

from datetime import UTC, datetime

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _us(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


class Month:
    """One calendar month: ``key`` ("2025-02"), ``start_us`` inclusive, ``end_us`` exclusive."""

    __slots__ = ("key", "start_us", "end_us")

    def __init__(self, now_us: int):
        moment = datetime.fromtimestamp(now_us // 1_000_000, UTC)
        year, month = moment.year, moment.month
        nxt = datetime(year + month // 12, month % 12 + 1, 1, tzinfo=UTC)
        self.key = f"{year:04d}-{month:02d}"
        self.start_us = _us(datetime(year, month, 1, tzinfo=UTC))
        self.end_us = _us(nxt)

    def contains(self, now_us: int) -> bool:
        return self.start_us <= now_us < self.end_us


class MonthCache:
    """Avoids a datetime conversion per admission: the month only changes once in ~30 days."""

    __slots__ = ("_month",)

    def __init__(self) -> None:
        self._month: Month | None = None

    def at(self, now_us: int) -> Month:
        month = self._month
        if month is None or not month.contains(now_us):
            month = self._month = Month(now_us)
        return month
