"""Budgets, in tokens and in money, by one mechanism (README.md in this folder, "Budgets"): a counter per budget
and period, seeded from the ledger the first time it is needed, a reservation of each request's upper bound at
admission (all of the request's budgets or none), settled to the real amount when the request ends.

A counter holds two figures: `charged` (settled amounts plus the reservations of requests in flight: what
admission compares with the limit, so concurrent requests can never together pass it) and `settled` (what
finished requests really cost: what alerts compare with their thresholds).
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

from gateway.limits.budget_model import BudgetLine, BudgetSpent, Hold, Seeder, Seeding, Settled, never_fits


class BudgetBook(Protocol):
    async def reserve(self, lines: list[BudgetLine], amounts: list[int]) -> Hold:
        """Reserve `amounts[i]` on `lines[i]`, all or none; BudgetSpent names the first line it does not fit."""
        ...

    async def settle(self, hold: Hold, actual: list[int]) -> Settled:
        """Charge the real amounts instead of the reservations (0 for a request refused after reserving)."""
        ...

    async def close(self) -> None: ...


class MemoryBook:
    """One gateway: counters in this process, seeded from the ledger at their first use after a start, so a
    restart resumes where the ledger stands. Reserving is synchronous once seeded, hence atomic."""

    SWEEP_EVERY = 4096

    def __init__(self, seeder: Seeder) -> None:
        self._seeding = Seeding(seeder)
        self._counts: dict[str, list[int]] = {}  # line id -> [charged, settled]
        self._ends: dict[str, float] = {}
        self._lock = threading.Lock()
        self._since_sweep = 0

    async def reserve(self, lines: list[BudgetLine], amounts: list[int]) -> Hold:
        never_fits(lines, amounts)
        for line in lines:
            if line.id not in self._counts:
                seed = await self._seeding.seed(line)
                with self._lock:
                    if line.id not in self._counts:  # another request may have seeded it meanwhile
                        self._counts[line.id] = [seed, seed]
                        self._ends[line.id] = line.end
        with self._lock:
            for line, amount in zip(lines, amounts):
                charged, settled = self._counts[line.id]
                if line.limit is not None and charged + amount > line.limit:
                    raise BudgetSpent(line, settled, charged - settled, amount)
            for line, amount in zip(lines, amounts):
                self._counts[line.id][0] += amount
            self._since_sweep += 1
            if self._since_sweep >= self.SWEEP_EVERY:
                self._sweep()
        return Hold(lines, amounts)

    async def settle(self, hold: Hold, actual: list[int]) -> Settled:
        if hold.settled or hold.degraded:
            return []
        hold.settled = True
        out: Settled = []
        with self._lock:
            for line, reserved, used in zip(hold.lines, hold.amounts, actual):
                counts = self._counts.get(line.id)
                if counts is None:  # swept: its period ended long ago
                    continue
                before = counts[1]
                counts[0] = max(0, counts[0] + used - reserved)
                counts[1] += used
                out.append((line, before, counts[1]))
        return out

    def _sweep(self) -> None:
        """Forget the counters of periods that ended a week ago (late settlements of long requests land first)."""
        self._since_sweep = 0
        cut = time.time() - 7 * 86400
        for line_id in [i for i, end in self._ends.items() if end < cut]:
            del self._counts[line_id], self._ends[line_id]

    async def close(self) -> None:
        self._counts.clear()


def open_book(redis_url: str | None, seeder: Seeder, *, fail_open: bool = False, credentials=None,
              key_prefix: str = "sluice:budget") -> BudgetBook:
    """None -> in this process; ``redis://…`` -> shared by every gateway of the fleet (as the limiter)."""
    if redis_url is None:
        return MemoryBook(seeder)
    from gateway.limits.redis_budgets import RedisBook  # imports redis only when it is configured

    return RedisBook(redis_url, seeder, fail_open=fail_open, credentials=credentials, key_prefix=key_prefix)
