"""One view's overview, as the dashboard shows it: tiles, time series stacked by a chosen group
(model, key, user, dialect, endpoint or adapter), breakdowns by model, key and user, 429 rejections
and cold-start waits over time, latency, time to first token, output speed and errors by status per
bucket, and the totals of the previous period of the same length.

Four queries answer it, run side by side: the sums grouped by (model, key, user) fold into the
tiles and the three breakdowns; the sums grouped by (time bucket, group) into the series; the
timings, exact, over the records (billing/insights/timings.py); and the previous period's totals.
The sums come from the rollups for the whole days (hours) of the window and from the records at
its edges (billing/insights/sources.py), through the same parts and `where` as the usage API, so
every number equals `GET /v1/usage` for the same selection.
Keys and users that were deleted since keep their rows: the ledger holds ids, and names come from
the auth side.
"""

from __future__ import annotations

import asyncio
import math

import msgspec

from billing.filters import Filters, Selection
from billing.insights.aggregate import group_key
from billing.insights.percentiles import Percentiles
from billing.insights.sources import Source, fetch_parts, for_buckets, for_totals
from billing.insights.sums import Sums, ranked
from billing.insights.timings import Timings, timings
from billing.store.base import UsageStore
from billing.timebuckets import Bucket, Bucketing, Granularity
from storage.sql_dialect import Params

MAX_BUCKETS = 10_000  # a series longer than this is no chart: ask for days instead of hours
# what the series may be split by -> the records' column (a fixed whitelist, never user text in SQL);
# "endpoint" is the API route called (/v1/chat/completions, ...)
SERIES_GROUPS = {"model": "model", "key": "key_id", "user": "user_id", "dialect": "dialect", "endpoint": "route",
                 "adapter": "adapter"}


class GroupSeries(msgspec.Struct):
    """One group's share of every bucket (lists aligned with `Series.buckets`)."""

    key: str  # the model, key id, user id ("-": service keys), dialect, route or adapter ("-": base model)
    requests: list[int]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    compute_tokens: list[int]
    cost_micros: list[int]


class Series(msgspec.Struct):
    granularity: str
    tz: str
    buckets: list[Bucket]  # every bucket of the window, empty ones too
    group_by: str  # a key of SERIES_GROUPS
    by_group: list[GroupSeries]  # sorted by key
    rate_limited: list[int]  # requests answered 429, per bucket, but for budget refusals
    budget_refused: list[int]  # requests a budget refused (429 or 402 by dialect), per bucket
    cold_starts: list[int]  # requests that waited for their endpoint to wake
    cold_start_ms_total: list[float]  # their summed wait (mean = total / cold_starts)
    cold_start_ms_max: list[float | None]


class Overview(msgspec.Struct):
    team_id: str | None
    start: float
    end: float
    filters: Filters
    totals: Sums
    error_rate: float  # (errors + rejected) / requests
    latency_ms: Percentiles
    ttft_ms: Percentiles
    series: Series
    by_model: list[Sums]  # each sorted by cost, then requests, descending; then key
    by_key: list[Sums]
    by_user: list[Sums]  # key NO_USER ("-") for requests made with service keys
    timings: Timings  # per bucket, aligned with series.buckets
    previous: Sums  # the same filters over the period of the same length just before the window
    step: int = 1  # hours per bucket: more than 1 when a long hourly view was asked for at most `max_points`


def bucketing_for(selection: Selection, granularity: Granularity, tz: str,
                  max_points: int | None = None) -> Bucketing:
    """ValueError (ZoneError for the zone) when the series could not be drawn. `max_points`: hours are taken
    several at a time (the fewest that keep the buckets under it), so a chart gets no more points than it has
    pixel columns."""
    bucketing = Bucketing(granularity, tz, selection.start, selection.end)
    if bucketing.count() > MAX_BUCKETS:
        raise ValueError(f"{granularity} buckets over this window exceed {MAX_BUCKETS}")
    if max_points and granularity == "hour" and bucketing.count() > max_points:
        step = min(24, math.ceil(bucketing.count() / max_points))
        bucketing = Bucketing(granularity, tz, selection.start, selection.end, step)
    return bucketing


def previous_period(selection: Selection) -> Selection:
    """The window of the same length that ends where this one starts."""
    return msgspec.structs.replace(selection, start=2 * selection.start - selection.end, end=selection.start)


async def overview(store: UsageStore, selection: Selection, granularity: Granularity = "day",
                   tz: str = "UTC", group_by: str = "model", max_points: int | None = None) -> Overview:
    bucketing = bucketing_for(selection, granularity, tz, max_points)
    (totals, by_model, by_key, by_user), series, (timed, measured), previous = await asyncio.gather(
        _breakdowns(store, selection), _series(store, selection, bucketing, group_by),
        timings(store, selection, bucketing), totals_of(store, previous_period(selection)))
    return Overview(selection.team_id, selection.start, selection.end, selection.filters, totals, totals.error_rate,
                    measured["latency_ms"], measured["ttft_ms"], series, by_model, by_key, by_user, timed, previous,
                    bucketing.step)


async def totals_of(store: UsageStore, selection: Selection) -> Sums:
    def statement(source: Source, part: Selection, params: Params) -> str:
        return f"SELECT {source.sums()} FROM {source.table} WHERE {source.where(part, params)}"

    totals = Sums("total")
    for values in await fetch_parts(store, for_totals(selection), statement):
        totals.add(Sums.of("total", values))
    return totals


async def _breakdowns(store: UsageStore, selection: Selection) -> tuple[Sums, list[Sums], list[Sums], list[Sums]]:
    def statement(source: Source, part: Selection, params: Params) -> str:
        return (f"SELECT model, key_id, user_id, {source.sums()} FROM {source.table} "
                f"WHERE {source.where(part, params)} GROUP BY model, key_id, user_id")

    totals = Sums("total")
    models: dict[str, Sums] = {}
    keys: dict[str, Sums] = {}
    users: dict[str, Sums] = {}
    for model, key_id, user_id, *values in await fetch_parts(store, for_totals(selection), statement):
        for groups, name in ((models, model), (keys, key_id), (users, group_key(user_id))):
            groups.setdefault(name, Sums(name)).add(Sums.of(name, values))
        totals.add(Sums.of("total", values))
    return totals, ranked(models.values()), ranked(keys.values()), ranked(users.values())


async def _series(store: UsageStore, selection: Selection, bucketing: Bucketing, group_by: str) -> Series:
    column = SERIES_GROUPS[group_by]

    def statement(source: Source, part: Selection, params: Params) -> str:
        key, span = bucketing.sql(store.dialect, source.time_column)
        return (f"SELECT {key} AS k, {span} AS s, {column} AS g, {source.series()} FROM {source.table} "
                f"WHERE {source.where(part, params)} GROUP BY k, s, g")

    rows = await fetch_parts(store, for_buckets(selection, bucketing, column), statement)
    buckets = bucketing.all()
    index = {b: i for i, b in enumerate(buckets)}
    width = len(buckets)
    groups: dict[str, GroupSeries] = {}
    rate_limited, budget_refused, cold, cold_total = [0] * width, [0] * width, [0] * width, [0.0] * width
    cold_max: list[float | None] = [None] * width
    positions: dict[tuple[int, int], int] = {}  # (key, span) -> bucket: one Bucket built per bucket, not per row
    for k, s, g, requests, prompt, completion, compute, cost, *_saved, limited, budget, waits, waited, longest in rows:
        i = positions.get((k, s))
        if i is None:
            i = positions[(k, s)] = index[bucketing.bucket(k, s)]
        name = group_key(g)
        m = groups.get(name)
        if m is None:
            m = groups[name] = GroupSeries(name, *([0] * width for _ in range(5)))
        for values, amount in ((m.requests, requests), (m.prompt_tokens, prompt), (m.completion_tokens, completion),
                               (m.compute_tokens, compute), (m.cost_micros, cost)):
            values[i] += int(amount)
        rate_limited[i] += int(limited)
        budget_refused[i] += int(budget)
        if waits:
            cold[i] += int(waits)
            cold_total[i] += float(waited)
            cold_max[i] = max(float(longest), cold_max[i] or 0.0)
    return Series(bucketing.granularity, bucketing.tz.key, buckets, group_by, [groups[g] for g in sorted(groups)],
                  rate_limited, budget_refused, cold, cold_total, cold_max)
