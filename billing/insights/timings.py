"""How fast and how well a view's requests went, bucket by bucket: latency and time-to-first-token
percentiles (p50, p95, p99, exact: nearest rank over the records, as billing/insights/percentiles.py),
output tokens per second, and the failed requests by HTTP status.

Only the records hold these (the rollups keep sums), so this reads the view's records once. PostgreSQL
computes the percentiles with `percentile_disc` grouped by bucket; SQLite has no ordered-set aggregate,
so one pass fetches each record's bucket and measures and Python sorts them, and the window's overall
percentiles come from the same pass.

Output tokens per second of a bucket = its completed requests' completion tokens / the time they spent
after their first token (latency - time to first token), over the requests that have both."""

from __future__ import annotations

import asyncio

import msgspec

from billing.filters import Selection, where
from billing.insights.percentiles import FRACTIONS, MEASURED, Percentiles, percentiles
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
    if store.dialect.name == "postgresql":
        return await _postgres(store, selection, bucketing)
    return await _sqlite(store, selection, bucketing)


def _index(bucketing: Bucketing) -> tuple[dict, int]:
    buckets = bucketing.all()
    return {b: i for i, b in enumerate(buckets)}, len(buckets)


def _rate(tokens: float, ms: float) -> float | None:
    return tokens * 1000 / ms if ms > 0 else None


async def _sqlite(store: UsageStore, selection: Selection, bucketing: Bucketing):
    params = Params(store.dialect)
    key, span = bucketing.sql(store.dialect)
    rows = await store.fetch(f"SELECT {key}, {span}, status, error_status, latency_ms, ttft_ms, completion_tokens "
                             f"FROM {TABLE} WHERE {where(selection, params)}", params.values)
    index, width = _index(bucketing)
    at = {}
    latency: list[list[float]] = [[] for _ in range(width)]
    ttft: list[list[float]] = [[] for _ in range(width)]
    tokens, spent = [0] * width, [0.0] * width
    errors: dict[str, list[int]] = {}
    for k, s, status, error_status, latency_ms, ttft_ms, completion in rows:
        i = at.get((k, s))
        if i is None:
            i = at[(k, s)] = index[bucketing.bucket(k, s)]
        if status in FAILED:
            errors.setdefault(_status(error_status), [0] * width)[i] += 1
        if status == "rejected":
            continue
        latency[i].append(latency_ms)
        if ttft_ms is not None:
            ttft[i].append(ttft_ms)
            if status == "ok" and latency_ms > ttft_ms:
                tokens[i] += completion
                spent[i] += latency_ms - ttft_ms
    overall = {"latency_ms": Percentiles.of([v for b in latency for v in b]),
               "ttft_ms": Percentiles.of([v for b in ttft for v in b])}
    return Timings([Percentiles.of(b) for b in latency], [Percentiles.of(b) for b in ttft],
                   [_rate(t, ms) for t, ms in zip(tokens, spent, strict=True)], _sorted(errors)), overall


async def _postgres(store: UsageStore, selection: Selection, bucketing: Bucketing):
    wanted = "ARRAY[" + ", ".join(str(f) for f in FRACTIONS) + "]::float8[]"
    key, span = bucketing.sql(store.dialect)

    async def measured() -> list:
        params = Params(store.dialect)
        select = ", ".join(f"COUNT({c}), percentile_disc({wanted}) WITHIN GROUP (ORDER BY {c})" for c in MEASURED)
        return await store.fetch(
            f"SELECT {key} AS k, {span} AS s, {select}, "
            f"SUM(CASE WHEN {_STREAMED} THEN completion_tokens ELSE 0 END), "
            f"SUM(CASE WHEN {_STREAMED} THEN latency_ms - ttft_ms ELSE 0 END) "
            f"FROM {TABLE} WHERE {where(selection, params)} AND status <> 'rejected' GROUP BY k, s", params.values)

    async def failed() -> list:
        params = Params(store.dialect)
        return await store.fetch(
            f"SELECT {key} AS k, {span} AS s, error_status, COUNT(*) FROM {TABLE} "
            f"WHERE {where(selection, params)} AND status IN ('error', 'rejected') GROUP BY k, s, error_status",
            params.values)

    rows, failures, overall = await asyncio.gather(measured(), failed(), percentiles(store, selection))
    index, width = _index(bucketing)
    latency, ttft = [Percentiles(0)] * width, [Percentiles(0)] * width
    rates: list[float | None] = [None] * width
    for k, s, n_latency, p_latency, n_ttft, p_ttft, tokens, spent in rows:
        i = index[bucketing.bucket(k, s)]  # one group per bucket: the span tells apart only hours
        latency[i] = Percentiles(int(n_latency), *p_latency) if n_latency else Percentiles(0)
        ttft[i] = Percentiles(int(n_ttft), *p_ttft) if n_ttft else Percentiles(0)
        rates[i] = _rate(int(tokens or 0), float(spent or 0))
    errors: dict[str, list[int]] = {}
    for k, s, error_status, n in failures:
        errors.setdefault(_status(error_status), [0] * width)[index[bucketing.bucket(k, s)]] += int(n)
    return Timings(latency, ttft, rates, _sorted(errors)), overall


def _status(error_status) -> str:
    return NO_STATUS if error_status is None else str(error_status)


def _sorted(errors: dict[str, list[int]]) -> dict[str, list[int]]:
    return dict(sorted(errors.items()))
