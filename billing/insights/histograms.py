"""A view's latency and time-to-first-token percentiles from the hourly histograms (billing/store/latency_rollup.py)
instead of the records: for views too large to sort (the 90-day hourly view of a busy team is 400,000 records and
a few thousand histogram rows). Each percentile is within latency_rollup.RELATIVE_ERROR (~4.9 %) of the exact
nearest-rank value that billing/insights/timings.py computes from the records; output tokens per second are exact.

The whole hours of the window come from the histograms, summed by SQL per (bucket, model), per bucket and over the
window; the partial hours at its edges from their records, binned here into the same buckets."""

from __future__ import annotations

import asyncio
import math
from bisect import bisect_left
from itertools import accumulate
from operator import add
from typing import Any

from billing.filters import Selection, where
from billing.insights.percentiles import FRACTIONS, MEASURED, Percentiles
from billing.insights.sources import HOURLY_ROLLUP, RAW, split
from billing.store.base import TABLE, UsageStore
from billing.store.latency_rollup import BUCKETS, LATENCY, STREAMED, bucket, middle
from billing.timebuckets import Bucketing
from storage.sql_dialect import Params

EXACT_UP_TO = 50_000  # a view of up to this many records gets exact percentiles (its sort costs ~50 ms)
_SUMS = "SUM(streamed_tokens), SUM(streamed_ms), " + ", ".join(
    f"SUM({prefix}_{i})" for prefix in ("lat", "ttft") for i in range(BUCKETS))

# (key, span, model; None: all models) -> (percentiles by column, streamed tokens, their ms), as timings' Scanned
Scanned = dict[tuple[int, int, str | None], tuple[dict[str, Percentiles], int, float]]
_Sums = list[Any]  # streamed tokens, their ms, latency counts (BUCKETS), ttft counts (BUCKETS)


def usable(selection: Selection, bucketing: Bucketing) -> bool:
    """Whether the histograms can answer this view (filtered at most by model; buckets of whole UTC hours)."""
    return HOURLY_ROLLUP.usable(selection, bucketing)


async def records_in(store: UsageStore, selection: Selection) -> int:
    """About how many records the view covers (its whole hours: the hourly rollup's count)."""
    params = Params(store.dialect)
    (row,) = await store.fetch(f"SELECT COALESCE(SUM(requests), 0) FROM {HOURLY_ROLLUP.table} "
                               f"WHERE {HOURLY_ROLLUP.where(selection, params)}", params.values)
    return int(row[0])


def percentiles_of(counts: list[int]) -> Percentiles:
    """Nearest-rank p50, p95, p99 of a histogram: the middle of the bucket that holds the ceil(p * n)-th value."""
    cumulative = list(accumulate(counts))
    n = cumulative[-1] if cumulative else 0
    if not n:
        return Percentiles(0)
    return Percentiles(n, *[_MIDDLES[bisect_left(cumulative, max(math.ceil(f * n), 1))] for f in FRACTIONS])


_MIDDLES = tuple(middle(i) for i in range(BUCKETS))


async def histogram_timings(store: UsageStore, selection: Selection,
                            bucketing: Bucketing) -> tuple[Scanned, dict[str, Percentiles]]:
    """The same answer as timings' exact scans, from the histograms (approximately: see the module)."""
    groups: dict[tuple[int, int, str | None], _Sums] = {}
    jobs = [_rollup(store, part, bucketing) if source is not RAW else _edge(store, part, bucketing)
            for source, part in split(selection, HOURLY_ROLLUP)]
    for rows in await asyncio.gather(*jobs):
        for k, s, model, sums in rows:
            lines: tuple[tuple[int, int, str | None], ...] = ((k, s, model), (k, s, None))
            for group in lines:  # the model's line, and all models together
                current = groups.get(group)
                groups[group] = sums if current is None else list(map(add, current, sums))  # never added in place
    window = _empty()
    out: Scanned = {}
    for line, sums in groups.items():
        out[line] = (_percentiles(sums), int(sums[0]), float(sums[1]))
        if line[2] is None:
            window = list(map(add, window, sums))
    return out, _percentiles(window)


def _empty() -> _Sums:
    return [0, 0.0, *([0] * (2 * BUCKETS))]


def _percentiles(sums: _Sums) -> dict[str, Percentiles]:
    return {MEASURED[0]: percentiles_of(sums[2:2 + BUCKETS]), MEASURED[1]: percentiles_of(sums[2 + BUCKETS:])}


async def _rollup(store: UsageStore, part: Selection, bucketing: Bucketing) -> list[tuple[int, int, str, _Sums]]:
    """The histograms of the part's whole hours, summed by SQL per (bucket, model)."""
    params = Params(store.dialect)
    key, span = bucketing.sql(store.dialect, "period")
    rows = await store.fetch(f"SELECT {key} AS k, {span} AS s, model, {_SUMS} FROM {LATENCY} "
                             f"WHERE {HOURLY_ROLLUP.where(part, params)} GROUP BY k, s, model", params.values)
    return [(int(row[0]), int(row[1]), row[2], list(row[3:])) for row in rows]


async def _edge(store: UsageStore, part: Selection, bucketing: Bucketing) -> list[tuple[int, int, str, _Sums]]:
    """A partial hour's records binned per (bucket, model) as the writer bins them."""
    params = Params(store.dialect)
    key, span = bucketing.sql(store.dialect)
    rows = await store.fetch(
        f"SELECT {key}, {span}, model, latency_ms, ttft_ms, CASE WHEN {STREAMED} THEN completion_tokens END "
        f"FROM {TABLE} WHERE {where(part, params)} AND status <> 'rejected'", params.values)
    binned: dict[tuple[int, int, str], _Sums] = {}
    for k, s, model, latency, ttft, streamed in rows:
        sums = binned.get((int(k), int(s), model))
        if sums is None:
            sums = binned[(int(k), int(s), model)] = _empty()
        sums[2 + bucket(latency)] += 1
        if ttft is not None:
            sums[2 + BUCKETS + bucket(ttft)] += 1
        if streamed is not None:
            sums[0] += streamed
            sums[1] += latency - ttft
    return [(k, s, model, sums) for (k, s, model), sums in binned.items()]
