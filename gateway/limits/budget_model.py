"""The budget book's vocabulary (budgets.py): a budget line, a refusal, a request's hold, the one seeding read."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

Measure = Literal["tokens", "micros"]


class BudgetLine(msgspec.Struct, frozen=True):
    """One budget of one scope in one period."""

    scope: str  # "key:<id>" or "team:<id>"
    measure: Measure  # tokens (prompt + compute) or micro-units of money
    period: Literal["month", "day"]  # UTC calendar month or day
    period_key: str  # "2026-12" (a UTC month) or "2026-12-06" (a UTC day)
    start: float  # unix seconds UTC, inclusive
    end: float  # exclusive: the budget resets then
    limit: int | None  # refused past it (a hard budget); None: counted only (a soft budget alerts)

    @property
    def id(self) -> str:
        return f"{self.scope}:{self.measure}:{self.period_key}"


# what the counter of a budget starts from: the ledger's sum of the scope's period so far
Seeder = Callable[[BudgetLine], Awaitable[int]]


class BudgetSpent(Exception):
    """The request's reservation does not fit a hard budget. `never` when it exceeds the whole limit by itself
    (no wait can help); else `settled` + `in_flight` (reserved by requests still running) + `asked` > limit."""

    def __init__(self, line: BudgetLine, settled: int, in_flight: int, asked: int, *, never: bool = False):
        super().__init__(f"{line.id}: {settled} + {in_flight} in flight + {asked} > {line.limit}")
        self.line, self.settled, self.in_flight, self.asked, self.never = line, settled, in_flight, asked, never


class Hold:
    """One request's reservations. Settle it once (a second settle is a no-op); `degraded`: reserved nothing
    (the shared backend was down and the book fails open)."""

    __slots__ = ("lines", "amounts", "settled", "degraded")

    def __init__(self, lines: list[BudgetLine], amounts: list[int], *, degraded: bool = False):
        self.lines, self.amounts, self.settled, self.degraded = lines, amounts, False, degraded


# per line settled: (line, settled before this request, settled after it); before is -1 when unknown
Settled = list[tuple[BudgetLine, int, int]]


def never_fits(lines: list[BudgetLine], amounts: list[int]) -> None:
    for line, amount in zip(lines, amounts):
        if line.limit is not None and amount > line.limit:
            raise BudgetSpent(line, 0, 0, amount, never=True)


class Seeding:
    """One read of the ledger per counter however many requests need it at once."""

    def __init__(self, seeder: Seeder) -> None:
        self._seeder = seeder
        self._reads: dict[str, asyncio.Future[int]] = {}

    async def seed(self, line: BudgetLine) -> int:
        pending = self._reads.get(line.id)
        if pending is None:
            pending = self._reads[line.id] = asyncio.ensure_future(self._seeder(line))
            pending.add_done_callback(lambda _: self._reads.pop(line.id, None))
        return await asyncio.shield(pending)
