"""How fast and how well a view's requests went, bucket by bucket, for all models together and for each
model on its own: latency and time-to-first-token percentiles (p50, p95, p99, exact: nearest rank over
the records, as billing/insights/percentiles.py), output tokens per second, and the failed requests by
HTTP status (all models).

A view of up to EXACT_UP_TO records reads the records, and one pass over them answers both views; a larger one
that the hourly histograms can answer (filtered at most by model, buckets of whole UTC hours) reads those instead,
within ~4.9 % (billing/insights/histograms.py; `Timings.approximate`).
PostgreSQL computes the percentiles with `percentile_disc` over the grouping sets (bucket, model) and
(bucket); SQLite has no ordered-set aggregate, so one pass fetches each record's bucket, model and
measures, Python sorts each (bucket, model) group, and a bucket's (and the window's) values are those
sorted runs merged (a sort of sorted runs is a merge). The window's overall percentiles come from the
same pass on SQLite (PostgreSQL: `percentile_disc` without groups). Failures by status are sums: the
daily rollup answers them for whole days, the hourly failures rollup for whole hours, the records for the rest.

Output tokens per second of a bucket = its completed requests' completion tokens / the time they spent
after their first token (latency - time to first token), over the requests that have both."""

from __future__ import annotations

import asyncio
from functools import partial
from itertools import chain
from operator import is_not
from typing import Any

import msgspec

from billing.filters import Selection, where
from billing.insights.histograms import EXACT_UP_TO, histogram_timings, records_in, usable
from billing.insights.percentiles import FRACTIONS, MEASURED, Percentiles, percentiles
from billing.insights.sources import Source, fetch_parts, for_failures
from billing.store.base import TABLE, UsageStore
from billing.timebuckets import Bucket, Bucketing
from storage.sql_dialect import Params

NO_STATUS = "other"  # a failed request recorded without an HTTP status (records from before schema 2)
_STREAMED = "status = 'ok' AND ttft_ms IS NOT NULL AND latency_ms > ttft_ms"  # requests with a generation time
FAILED = ("error", "rejected")


class ModelTimings(msgspec.Struct):
    """One model's own timings, lists aligned with the view's buckets."""

    model: str
    latency_ms: list[Percentiles]
    ttft_ms: list[Percentiles]
    output_tokens_per_s: list[float | None]


class Timings(msgspec.Struct):
    """Lists aligned with the view's buckets (`Series.buckets`), all models together; `by_model` each model's."""

    latency_ms: list[Percentiles]
    ttft_ms: list[Percentiles]
    output_tokens_per_s: list[float | None]  # None: no completed request with a first token
    errors_by_status: dict[str, list[int]]  # "429", "500", ... (NO_STATUS): failed and rejected requests
    by_model: list[ModelTimings] = []  # sorted by model; the models that reached a worker in the window
    approximate: bool = False  # percentiles from the hourly histograms (within histograms.RELATIVE_ERROR), not exact


async def timings(store: UsageStore, selection: Selection, bucketing: Bucketing,
                  exact_up_to: int = EXACT_UP_TO) -> tuple[Timings, dict[str, Percentiles]]:
    """The view's timings per bucket (and per model and bucket), and its overall latency and ttft percentiles: exact
    from the records for a view of up to `exact_up_to` records, else from the hourly histograms where they can answer
    it (`approximate`: billing/insights/histograms.py)."""
    index, width = _index(bucketing)
    scan = _postgres if store.dialect.ordered_set_aggregates else _sqlite
    approximate = usable(selection, bucketing) and await records_in(store, selection) > exact_up_to
    if approximate:
        scan = histogram_timings
    (scanned, overall), errors = await asyncio.gather(scan(store, selection, bucketing),
                                                      _errors(store, selection, bucketing))
    lines: dict[str | None, Line] = {}  # model -> latency, ttft, tokens, their ms
    positions: dict[tuple[int, int], int] = {}
    for (k, s, model), (ranked, streamed_tokens, streamed_ms) in scanned.items():
        line = lines.get(model)
        if line is None:
            line = lines[model] = _empty(width)
        i = positions.get((k, s))
        if i is None:  # one group per bucket and model: the span tells only hours apart
            i = positions[(k, s)] = index[bucketing.bucket(k, s)]
        line[0][i], line[1][i] = ranked["latency_ms"], ranked["ttft_ms"]
        line[2][i] += int(streamed_tokens or 0)
        line[3][i] += float(streamed_ms or 0)

    def measured(model: str | None) -> tuple[list[Percentiles], list[Percentiles], list[float | None]]:
        latency, ttft, tokens, spent = lines.get(model) or _empty(width)
        return latency, ttft, [_rate(t, ms) for t, ms in zip(tokens, spent, strict=True)]

    failed: dict[str, list[int]] = {}
    for k, s, error_status, n in errors:
        failed.setdefault(_status(error_status), [0] * width)[index[bucketing.bucket(k, s)]] += int(n)
    models = sorted(m for m in lines if m is not None)
    return Timings(*measured(None), dict(sorted(failed.items())),
                   [ModelTimings(m, *measured(m)) for m in models], approximate), overall


def _empty(width: int) -> Line:
    """A line with nothing measured: latency and ttft percentiles, streamed tokens and their ms, per bucket."""
    return [Percentiles(0)] * width, [Percentiles(0)] * width, [0] * width, [0.0] * width


def _index(bucketing: Bucketing) -> tuple[dict[Bucket, int], int]:
    buckets = bucketing.all()
    return {b: i for i, b in enumerate(buckets)}, len(buckets)


def _rate(tokens: float, ms: float) -> float | None:
    return tokens * 1000 / ms if ms > 0 else None


def _status(error_status: int | None) -> str:
    # the daily rollup keeps "no status" as 0 (its keys are NULL-free)
    return NO_STATUS if not error_status else str(error_status)


async def _errors(store: UsageStore, selection: Selection, bucketing: Bucketing) -> list[tuple[Any, ...]]:
    """(key, span, error status, failed requests): sums, so the daily rollup answers the whole days."""
    def statement(source: Source, part: Selection, params: Params) -> str:
        key, span = bucketing.sql(store.dialect, source.time_column)
        failed = "', '".join(FAILED)
        return (f"SELECT {key} AS k, {span} AS s, error_status, {source.requests} FROM {source.table} "
                f"WHERE {source.where(part, params)} AND status IN ('{failed}') GROUP BY k, s, error_status")

    return await fetch_parts(store, for_failures(selection, bucketing), statement)


# per bucket: latency and ttft percentiles, streamed tokens and their ms
Line = tuple[list[Percentiles], list[Percentiles], list[int], list[float]]
# (key, span, model; None: all models) -> (percentiles by column, streamed requests' completion tokens, their ms
# after the first token)
Scanned = dict[tuple[int, int, str | None], tuple[dict[str, Percentiles], int, float]]


async def _postgres(store: UsageStore, selection: Selection,
                    bucketing: Bucketing) -> tuple[Scanned, dict[str, Percentiles]]:
    async def grouped() -> list[tuple[Any, ...]]:
        params = Params(store.dialect)
        key, span = bucketing.sql(store.dialect)
        wanted = "ARRAY[" + ", ".join(str(f) for f in FRACTIONS) + "]::float8[]"
        select = ", ".join(f"COUNT({c}), percentile_disc({wanted}) WITHIN GROUP (ORDER BY {c})" for c in MEASURED)
        return await store.fetch(
            f"SELECT k, s, GROUPING(model), model, {select}, SUM(streamed_tokens), SUM(streamed_ms) FROM ("
            f"SELECT {key} AS k, {span} AS s, model, {', '.join(MEASURED)}, "
            f"CASE WHEN {_STREAMED} THEN completion_tokens ELSE 0 END AS streamed_tokens, "
            f"CASE WHEN {_STREAMED} THEN latency_ms - ttft_ms ELSE 0 END AS streamed_ms FROM {TABLE} "
            f"WHERE {where(selection, params)} AND status <> 'rejected') AS measured "
            "GROUP BY GROUPING SETS ((k, s, model), (k, s))", params.values)

    rows, overall = await asyncio.gather(grouped(), percentiles(store, selection))
    out: Scanned = {}
    for k, s, all_models, model, *measures, tokens, spent in rows:
        ranked = {}
        for i, column in enumerate(MEASURED):
            n, values = int(measures[2 * i]), measures[2 * i + 1]
            ranked[column] = Percentiles(n, *values) if n else Percentiles(0)
        out[(int(k), int(s), None if all_models else model)] = (ranked, int(tokens or 0), float(spent or 0))
    return out, overall


async def _sqlite(store: UsageStore, selection: Selection,
                  bucketing: Bucketing) -> tuple[Scanned, dict[str, Percentiles]]:
    """SQLite has no ordered-set aggregate (and its window functions sort far slower than Python): one pass
    fetches each record's bucket, model and measures; Python sorts each (bucket, model) group's values, and
    a bucket's and the window's are those sorted runs merged (Python's sort merges runs in linear time)."""
    params = Params(store.dialect)
    key, span = bucketing.sql(store.dialect)
    rows = await store.fetch(
        f"SELECT {key}, {span}, model, {', '.join(MEASURED)}, CASE WHEN {_STREAMED} THEN completion_tokens END "
        f"FROM {TABLE} WHERE {where(selection, params)} AND status <> 'rejected'", params.values)
    groups: dict[tuple[Any, ...], list[tuple[Any, ...]]] = {}
    for row in rows:
        groups.setdefault(row[:3], []).append(row)
    columns = range(len(MEASURED))
    out: Scanned = {}
    # sorted runs per column; [streamed tokens (an int), their ms]
    buckets: dict[tuple[int, int], tuple[list[list[list[float]]], list[Any]]] = {}
    for (k, s, model), group in groups.items():
        _, _, _, latency, ttft, streamed = zip(*group, strict=True)  # columns (built in C, as the filters and sorts)
        ordered = [sorted(filter(_present, values)) for values in (latency, ttft)]
        tokens = sum(filter(_present, streamed))
        spent = sum([lat - first for lat, first, t in zip(latency, ttft, streamed, strict=True) if t is not None])
        out[(int(k), int(s), model)] = (_ranked(ordered), tokens, spent)
        runs, sums = buckets.setdefault((int(k), int(s)), ([[] for _ in columns], [0, 0.0]))
        for c in columns:
            runs[c].append(ordered[c])
        sums[0] += tokens
        sums[1] += spent
    window: list[list[list[float]]] = [[] for _ in columns]
    for (k, s), (runs, (tokens, spent)) in buckets.items():
        merged = [runs[c][0] if len(runs[c]) == 1 else sorted(chain.from_iterable(runs[c])) for c in columns]
        out[(k, s, None)] = (_ranked(merged), tokens, spent)
        for c in columns:
            window[c].append(merged[c])
    return out, _ranked([sorted(chain.from_iterable(window[c])) for c in columns])


_present = partial(is_not, None)


def _ranked(ordered: list[list[float]]) -> dict[str, Percentiles]:
    return {column: Percentiles.ranked(ordered[c]) for c, column in enumerate(MEASURED)}
