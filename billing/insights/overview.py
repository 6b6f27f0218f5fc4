"""One view's overview, as the dashboard shows it: tiles, time series stacked by model, breakdowns
by model, key and user, 429 rejections and cold-start waits over time.

Three queries answer it, run side by side: the sums grouped by (model, key, user) fold into the
tiles and the three breakdowns; the sums grouped by (time bucket, model) into the series; and the
percentiles, exact, over the records. The sums come from the rollups for the whole days (hours)
of the window and from the records at its edges (billing/insights/sources.py), through the same
parts and `where` as the usage API, so every number equals `GET /v1/usage` for the same selection.
Keys and users that were deleted since keep their rows: the ledger holds ids, and names come from
the auth side.
"""

from __future__ import annotations

import asyncio

import msgspec

from billing.filters import Filters, Selection
from billing.insights.aggregate import group_key
from billing.insights.percentiles import Percentiles, percentiles
from billing.insights.sources import Source, fetch_parts, for_buckets, for_totals
from billing.insights.sums import Sums, ranked
from billing.store.base import UsageStore
from billing.store.sql import Params
from billing.timebuckets import Bucket, Bucketing, Granularity

MAX_BUCKETS = 10_000  # a series longer than this is no chart: ask for days instead of hours


class ModelSeries(msgspec.Struct):
    """One model's share of every bucket (lists aligned with `Series.buckets`)."""

    model: str
    requests: list[int]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    compute_tokens: list[int]
    cost_micros: list[int]


class Series(msgspec.Struct):
    granularity: str
    tz: str
    buckets: list[Bucket]  # every bucket of the window, empty ones too
    by_model: list[ModelSeries]  # sorted by model name
    rate_limited: list[int]  # requests answered 429, per bucket
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


def bucketing_for(selection: Selection, granularity: Granularity, tz: str) -> Bucketing:
    """ValueError (ZoneError for the zone) when the series could not be drawn."""
    bucketing = Bucketing(granularity, tz, selection.start, selection.end)
    if bucketing.count() > MAX_BUCKETS:
        raise ValueError(f"{granularity} buckets over this window exceed {MAX_BUCKETS}")
    return bucketing


async def overview(store: UsageStore, selection: Selection, granularity: Granularity = "day",
                   tz: str = "UTC") -> Overview:
    bucketing = bucketing_for(selection, granularity, tz)
    (totals, by_model, by_key, by_user), series, measured = await asyncio.gather(
        _breakdowns(store, selection), _series(store, selection, bucketing), percentiles(store, selection))
    return Overview(selection.team_id, selection.start, selection.end, selection.filters, totals, totals.error_rate,
                    measured["latency_ms"], measured["ttft_ms"], series, by_model, by_key, by_user)


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


async def _series(store: UsageStore, selection: Selection, bucketing: Bucketing) -> Series:
    def statement(source: Source, part: Selection, params: Params) -> str:
        key, span = bucketing.sql(store.dialect, source.time_column)
        return (f"SELECT {key} AS k, {span} AS s, model, {source.series()} FROM {source.table} "
                f"WHERE {source.where(part, params)} GROUP BY k, s, model")

    rows = await fetch_parts(store, for_buckets(selection, bucketing), statement)
    buckets = bucketing.all()
    index = {b: i for i, b in enumerate(buckets)}
    width = len(buckets)
    models: dict[str, ModelSeries] = {}
    rate_limited, cold, cold_total = [0] * width, [0] * width, [0.0] * width
    cold_max: list[float | None] = [None] * width
    for k, s, model, requests, prompt, completion, compute, cost, limited, waits, waited, longest in rows:
        i = index[bucketing.bucket(k, s)]
        m = models.get(model)
        if m is None:
            m = models[model] = ModelSeries(model, *([0] * width for _ in range(5)))
        for values, amount in ((m.requests, requests), (m.prompt_tokens, prompt), (m.completion_tokens, completion),
                               (m.compute_tokens, compute), (m.cost_micros, cost)):
            values[i] += int(amount)
        rate_limited[i] += int(limited)
        if waits:
            cold[i] += int(waits)
            cold_total[i] += float(waited)
            cold_max[i] = max(float(longest), cold_max[i] or 0.0)
    return Series(bucketing.granularity, bucketing.tz.key, buckets, [models[m] for m in sorted(models)],
                  rate_limited, cold, cold_total, cold_max)
