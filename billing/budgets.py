"""Spend against a budget in money: the budget's period (a UTC calendar month or day), the spend of a team or a
key in it as the ledger's store holds it, and the alert thresholds a spend has reached.

The gateway enforces and announces budgets (gateway/serving/spending.py); the table of alerts already sent
(`UsageStore.claim_alert`) lives with the ledger, so every gateway of a fleet sees the same record.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Literal

import msgspec

from billing.filters import Filters, Selection
from billing.insights.month import BUDGET_TOKENS, month_bounds
from billing.insights.sources import Source, fetch_parts, for_totals
from billing.store.base import UsageStore
from storage.sql_dialect import Params

Period = Literal["month", "day"]
THRESHOLDS: tuple[int, ...] = (50, 80, 100)  # percent of the amount


class Window(msgspec.Struct, frozen=True):
    """One period: `key` ("2026-11" or "2026-11-26"), [start, end) in unix seconds UTC."""

    key: str
    start: float
    end: float


def period_window(period: Period, now: float) -> Window:
    moment = datetime.fromtimestamp(now, UTC)
    if period == "day":
        first = datetime(moment.year, moment.month, moment.day, tzinfo=UTC)
        return Window(first.strftime("%Y-%m-%d"), first.timestamp(), (first + timedelta(days=1)).timestamp())
    return Window(*month_bounds(now))


def reached(spent_micros: int, amount_micros: int) -> list[int]:
    """The thresholds (percent) a spend has reached, lowest first."""
    return [t for t in THRESHOLDS if spent_micros * 100 >= amount_micros * t]


async def spent_micros(store: UsageStore, scope: str, window: Window, now: float) -> int:
    """The cost of `scope`'s requests ("team:<id>" or "key:<id>", a key across every team it bills) from the
    window's start to `now`, in micro-units."""
    return await _summed(store, scope, window, now, "SUM(cost_micros)")


async def spent_tokens(store: UsageStore, scope: str, window: Window, now: float) -> int:
    """The tokens a monthly token budget counts (prompt + compute, as the limiter charges them) of `scope`'s
    requests from the window's start to `now`."""
    return await _summed(store, scope, window, now, BUDGET_TOKENS)


async def _summed(store: UsageStore, scope: str, window: Window, now: float, measure: str) -> int:
    kind, _, owner = scope.partition(":")
    if kind == "team":
        selection = Selection(window.start, min(now, window.end), owner, Filters())
    elif kind == "key":
        selection = Selection(window.start, min(now, window.end), None, Filters(key_ids=(owner,)))
    else:
        raise ValueError(f"unknown budget scope {scope!r}")
    if selection.end <= selection.start:
        return 0

    def summed(source: Source, part: Selection, params: Params) -> str:
        return f"SELECT {measure} FROM {source.table} WHERE {source.where(part, params)}"

    rows = await fetch_parts(store, for_totals(selection), summed)
    return sum(int(row[0] or 0) for row in rows)
