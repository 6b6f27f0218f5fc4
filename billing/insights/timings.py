"""How fast and how well a view's requests went, bucket by bucket: latency and time-to-first-token
percentiles (p50, p95, p99, exact: nearest rank over the records, as billing/insights/percentiles.py),
output tokens per second, and the failed requests by HTTP status.

Only the records hold these (the rollups keep sums). PostgreSQL computes the percentiles with
`percentile_disc` grouped by bucket; SQLite has no ordered-set aggregate, so one pass fetches each
record's bucket and measures and Python sorts them; the window's overall percentiles come from the same
pass (PostgreSQL: `percentile_disc` without groups). Failures by status are sums: the daily rollup
answers them for whole days, the records for the rest.

Output tokens per second of a bucket = its completed requests' completion tokens / the time they spent
after their first token (latency - time to first token), over the requests that have both."""

from __future__ import annotations

import asyncio

import msgspec

from billing.filters import Selection, where
from billing.insights.percentiles import FRACTIONS, MEASURED, Percentiles, percentiles
from billing.insights.sources import Source, fetch_parts, for_buckets
from billing.store.base import TABLE, UsageStore
from billing.store.sql import Params
from billing.timebuckets import Bucketing

NO_STATUS = "other"  # a failed request recorded without an HTTP status (records from before schema 2)
_STREAMED = "status = 'ok' AND ttft_ms IS NOT NULL AND latency_ms > ttft_ms"  # requests with a generation time
FAILED = ("error", "rejected")


class Timings(msgspec.Struct):
    """Lists aligned with the view's buckets (`Series.buckets`)."""

    latency_ms: list[Percentiles]
    ttft_ms: list[Percentiles]
    output_tokens_per_s: list[float | None]  # None: no completed request with a first token
    errors_by_status: dict[str, list[int]]  # "429", "500", ... (NO_STATUS): failed and rejected requests


async def timings(store: UsageStore, selection: Selection,
                  bucketing: Bucketing) -> tuple[Timings, dict[str, Percentiles]]:
    """The view's timings per bucket, and its overall latency and ttft percentiles."""
    index, width = _index(bucketing)
    scan = _postgres if store.dialect.name == "postgresql" else _sqlite
    (per_bucket, overall), errors = await asyncio.gather(scan(store, selection, bucketing), _errors(store, selection,
                                                                                                 bucketing))
    measured = {column: [Percentiles(0)] * width for column in MEASURED}
    tokens, spent = [0] * width, [0.0] * width
    for (k, s), (ranked, streamed_tokens, streamed_ms) in per_bucket.items():
        i = index[bucketing.bucket(k, s)]  # one group per bucket: the span tells only hours apart
        for column in MEASURED:
            measured[column][i] = ranked[column]
        tokens[i] += int(streamed_tokens or 0)
        spent[i] += float(streamed_ms or 0)
    failed: dict[str, list[int]] = {}
    for k, s, error_status, n in errors:
        failed.setdefault(_status(error_status), [0] * width)[index[bucketing.bucket(k, s)]] += int(n)
    return Timings(measured["latency_ms"], measured["ttft_ms"],
                   [_rate(t, ms) for t, ms in zip(tokens, spent, strict=True)], dict(sorted(failed.items()))), overall


def _index(bucketing: Bucketing) -> tuple[dict, int]:
    buckets = bucketing.all()
    return {b: i for i, b in enumerate(buckets)}, len(buckets)


def _rate(tokens: float, ms: float) -> float | None:
    return tokens * 1000 / ms if ms > 0 else None


def _status(error_status) -> str:
    # the daily rollup keeps "no status" as 0 (its keys are NULL-free)
    return NO_STATUS if not error_status else str(error_status)


async def _errors(store: UsageStore, selection: Selection, bucketing: Bucketing) -> list:
    """(key, span, error status, failed requests): sums, so the daily rollup answers the whole days."""
    def statement(source: Source, part: Selection, params: Params) -> str:
        key, span = bucketing.sql(store.dialect, source.time_column)
        failed = "', '".join(FAILED)
        return (f"SELECT {key} AS k, {span} AS s, error_status, {source.requests} FROM {source.table} "
                f"WHERE {source.where(part, params)} AND status IN ('{failed}') GROUP BY k, s, error_status")

    return await fetch_parts(store, for_buckets(selection, bucketing, "status", "error_status"), statement)


# (key, span) -> (percentiles by column, streamed requests' completion tokens, their ms after the first token)
Scanned = dict[tuple[int, int], tuple[dict[str, Percentiles], int, float]]


async def _postgres(store: UsageStore, selection: Selection,
                    bucketing: Bucketing) -> tuple[Scanned, dict[str, Percentiles]]:
    async def grouped() -> list:
        params = Params(store.dialect)
        key, span = bucketing.sql(store.dialect)
        wanted = "ARRAY[" + ", ".join(str(f) for f in FRACTIONS) + "]::float8[]"
        select = ", ".join(f"COUNT({c}), percentile_disc({wanted}) WITHIN GROUP (ORDER BY {c})" for c in MEASURED)
        return await store.fetch(
            f"SELECT {key} AS k, {span} AS s, {select}, SUM(CASE WHEN {_STREAMED} THEN completion_tokens ELSE 0 END), "
            f"SUM(CASE WHEN {_STREAMED} THEN latency_ms - ttft_ms ELSE 0 END) FROM {TABLE} "
            f"WHERE {where(selection, params)} AND status <> 'rejected' GROUP BY k, s", params.values)

    rows, overall = await asyncio.gather(grouped(), percentiles(store, selection))
    out: Scanned = {}
    for k, s, *measures, tokens, spent in rows:
        ranked = {}
        for i, column in enumerate(MEASURED):
            n, values = int(measures[2 * i]), measures[2 * i + 1]
            ranked[column] = Percentiles(n, *values) if n else Percentiles(0)
        out[(int(k), int(s))] = (ranked, int(tokens or 0), float(spent or 0))
    return out, overall


async def _sqlite(store: UsageStore, selection: Selection,
                  bucketing: Bucketing) -> tuple[Scanned, dict[str, Percentiles]]:
    """SQLite has no ordered-set aggregate (and its window functions sort far slower than Python): one pass
    fetches each record's bucket and measures, Python sorts each bucket's values and the window's."""
    params = Params(store.dialect)
    key, span = bucketing.sql(store.dialect)
    rows = await store.fetch(
        f"SELECT {key}, {span}, latency_ms, ttft_ms, CASE WHEN {_STREAMED} THEN completion_tokens END FROM {TABLE} "
        f"WHERE {where(selection, params)} AND status <> 'rejected'", params.values)
    groups: dict[tuple[int, int], list] = {}
    for row in rows:
        groups.setdefault((row[0], row[1]), []).append(row)
    out: Scanned = {}
    for (k, s), group in groups.items():
        streamed = [(r[4], r[2] - r[3]) for r in group if r[4] is not None]
        out[(int(k), int(s))] = ({c: Percentiles.of([r[2 + i] for r in group]) for i, c in enumerate(MEASURED)},
                                 sum(t for t, _ in streamed), sum(ms for _, ms in streamed))
    overall = {c: Percentiles.of([r[2 + i] for r in rows]) for i, c in enumerate(MEASURED)}
    return out, overall
