"""Month-to-date usage of a team and a projection to the month's end, for the budget tile.

Months are UTC calendar months, as the monthly token budget (gateway/serving/budget_gate.py), and
budget tokens are counted as it counts them: prompt + compute tokens.

Projection: the month so far plus the recent rate carried to the month's end. The rate is the
usage of the trailing 7 days (or since the team's first request when it is younger) per second: it
follows a team whose traffic changed this month better than the month's own average, and a weekly
window smooths weekends out. A team with less than a full day of traffic gets no projection: an
hour (a test, a burst) carried over a month is no forecast ($0.26 in an hour read as $158.94). The
projection is a forecast, not a bill.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import msgspec

from billing.filters import Filters, Selection, where
from billing.insights.sources import Source, fetch_parts, for_totals
from billing.insights.sums import Sums
from billing.store.base import TABLE, UsageStore
from storage.sql_dialect import Params

TRAILING_S = 7 * 86400
MIN_HISTORY_S = 86400  # the least traffic history a projection is made from: one full day
BUDGET_TOKENS = "SUM(prompt_tokens + compute_tokens)"  # what a monthly token budget counts
NO_FILTERS = Filters()


class MonthToDate(msgspec.Struct):
    month: str  # "2025-03"
    start: float  # the month's first instant (unix seconds UTC)
    end: float  # the next month's first instant
    now: float
    usage: Sums  # the month so far
    budget_tokens_used: int  # prompt + compute tokens this month
    rate_window_s: float  # the span the rate below was measured over (the team's history, at most a week)
    projected_tokens: int | None  # budget tokens at the month's end, at the recent rate; None: under a day of history
    projected_cost_micros: int | None
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
        return f"SELECT {BUDGET_TOKENS}, SUM(cost_micros) FROM {source.table} WHERE {source.where(part, params)}"

    trailing = Selection(trailing_start, now, team_id, filters)
    month_rows, recent_rows, older, first = await asyncio.gather(
        fetch_parts(store, for_totals(Selection(start, now, team_id, filters)), so_far),
        fetch_parts(store, for_totals(trailing), recent),
        _any(store, Selection(0.0, trailing_start, team_id, filters)), _first(store, trailing))
    usage = Sums("month")
    used = recent_tokens = recent_cost = 0
    for *values, tokens in month_rows:
        if values[0]:
            usage.add(Sums.of("month", values))
            used += int(tokens)
    for tokens, cost in recent_rows:
        recent_tokens, recent_cost = recent_tokens + int(tokens or 0), recent_cost + int(cost or 0)
    # a team younger than the trailing window is measured from its first request (read from the records, exact)
    since = trailing_start if older or first is None else first
    window = max(now - since, 0.0)
    remaining = max(end - now, 0.0)
    projected_tokens = projected_cost = None
    if window >= MIN_HISTORY_S:
        projected_tokens = used + round(recent_tokens * remaining / window)
        projected_cost = usage.cost_micros + round(recent_cost * remaining / window)
    out = MonthToDate(month, start, end, now, usage, used, window, projected_tokens, projected_cost)
    if budget_tokens is not None:
        out.budget_tokens = budget_tokens
        out.used_fraction = used / budget_tokens if budget_tokens else None
        if projected_tokens is not None and budget_tokens:
            out.projected_fraction = projected_tokens / budget_tokens
        if used >= budget_tokens:
            out.exhausted_at = now
        elif recent_tokens and projected_tokens is not None and projected_tokens > budget_tokens:
            out.exhausted_at = now + (budget_tokens - used) * window / recent_tokens
    return out


async def _first(store: UsageStore, selection: Selection) -> float | None:
    """When the selection's first request arrived (None: it has none)."""
    params = Params(store.dialect)
    rows = await store.fetch(f"SELECT MIN(time) FROM {TABLE} WHERE {where(selection, params)}", params.values)
    return float(rows[0][0]) if rows and rows[0][0] is not None else None


async def _any(store: UsageStore, selection: Selection) -> bool:
    params = Params(store.dialect)
    return bool(await store.fetch(f"SELECT 1 FROM {TABLE} WHERE {where(selection, params)} LIMIT 1", params.values))
