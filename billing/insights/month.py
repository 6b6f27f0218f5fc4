"""Month-to-date usage of a team and a projection to the month's end, for the budget tile.

Months are UTC calendar months, as the limiter's monthly token budget (gateway/limits/month.py), and
budget tokens are counted as it counts them: prompt + compute tokens.

Projection: the month so far plus the recent rate carried to the month's end. The rate is the
usage of the trailing 7 days (or since the team's first day when it is younger, but at least an
hour) per second: it follows a team whose traffic changed this month better than the month's own
average, and a weekly window smooths weekends out. The projection is a forecast, not a bill.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import msgspec

from billing.filters import Filters, Selection, where
from billing.insights.sources import Source, fetch_parts, for_totals
from billing.insights.sums import Sums
from billing.store.base import TABLE, UsageStore
from billing.store.sql import Params

TRAILING_S = 7 * 86400
_MIN_RATE_WINDOW_S = 3600
BUDGET_TOKENS = "SUM(prompt_tokens + compute_tokens)"  # what a monthly token budget counts
NO_FILTERS = Filters()


class MonthToDate(msgspec.Struct):
    month: str  # "2025-03"
    start: float  # the month's first instant (unix seconds UTC)
    end: float  # the next month's first instant
    now: float
    usage: Sums  # the month so far
    budget_tokens_used: int  # prompt + compute tokens this month
    rate_window_s: float  # the span the rate below was measured over
    projected_tokens: int  # budget tokens at the month's end, at the recent rate
    projected_cost_micros: int
    budget_tokens: int | None = None  # the team's monthly token budget, when it has one
    used_fraction: float | None = None
    projected_fraction: float | None = None
    exhausted_at: float | None = None  # when the budget runs out at the recent rate, if within the month


def month_bounds(now: float) -> tuple[str, float, float]:
    moment = datetime.fromtimestamp(now, UTC)
    first = datetime(moment.year, moment.month, 1, tzinfo=UTC)
    following = datetime(moment.year + moment.month // 12, moment.month % 12 + 1, 1, tzinfo=UTC)
    return f"{moment.year:04d}-{moment.month:02d}", first.timestamp(), following.timestamp()


async def month_to_date(store: UsageStore, team_id: str, now: float, *, budget_tokens: int | None = None,
                        filters: Filters = NO_FILTERS) -> MonthToDate:
    month, start, end = month_bounds(now)
    trailing_start = now - TRAILING_S

    def so_far(source: Source, part: Selection, params: Params) -> str:
        return f"SELECT {source.sums()}, {BUDGET_TOKENS} FROM {source.table} WHERE {source.where(part, params)}"

    def recent(source: Source, part: Selection, params: Params) -> str:
        return (f"SELECT {BUDGET_TOKENS}, SUM(cost_micros), MIN({source.time_column}) FROM {source.table} "
                f"WHERE {source.where(part, params)}")

    month_rows, recent_rows, older = await asyncio.gather(
        fetch_parts(store, for_totals(Selection(start, now, team_id, filters)), so_far),
        fetch_parts(store, for_totals(Selection(trailing_start, now, team_id, filters)), recent),
        _any(store, Selection(0.0, trailing_start, team_id, filters)))
    usage = Sums("month")
    used = recent_tokens = recent_cost = 0
    for *values, tokens in month_rows:
        if values[0]:
            usage.add(Sums.of("month", values))
            used += int(tokens)
    firsts = []
    for tokens, cost, first in recent_rows:
        recent_tokens, recent_cost = recent_tokens + int(tokens or 0), recent_cost + int(cost or 0)
        if first is not None:
            firsts.append(float(first))
    # a team younger than the trailing window is measured from its first day (rollups keep days)
    since = trailing_start if older or not firsts else min(firsts)
    window = max(now - since, _MIN_RATE_WINDOW_S)
    remaining = max(end - now, 0.0)
    projected_tokens = used + round(recent_tokens * remaining / window)
    out = MonthToDate(month, start, end, now, usage, used, window, projected_tokens,
                      usage.cost_micros + round(recent_cost * remaining / window))
    if budget_tokens is not None:
        out.budget_tokens = budget_tokens
        out.used_fraction = used / budget_tokens if budget_tokens else None
        out.projected_fraction = projected_tokens / budget_tokens if budget_tokens else None
        if used >= budget_tokens:
            out.exhausted_at = now
        elif recent_tokens and projected_tokens > budget_tokens:
            out.exhausted_at = now + (budget_tokens - used) * window / recent_tokens
    return out


async def _any(store: UsageStore, selection: Selection) -> bool:
    params = Params(store.dialect)
    return bool(await store.fetch(f"SELECT 1 FROM {TABLE} WHERE {where(selection, params)} LIMIT 1", params.values))
