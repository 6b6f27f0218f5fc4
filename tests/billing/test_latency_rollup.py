"""The hourly latency histograms (billing/store/latency_rollup.py) and failures (failure_rollup.py), on both
stores: the writer keeps them equal to plain Python over the stored records (and to the migration's SQL backfill
over the same records), and the percentiles read from the histograms stay within latency_rollup.RELATIVE_ERROR of
the exact ones, bucket by bucket, for all models and each model, with the window's partial hours read from the
records."""

from __future__ import annotations

import bisect
import math
from collections import defaultdict

import pytest

from billing.filters import Filters, Selection
from billing.insights.histograms import percentiles_of
from billing.insights.overview import bucketing_for
from billing.insights.timings import timings
from billing.store import failure_rollup
from billing.store.latency_rollup import BUCKETS, EDGES, LATENCY, RELATIVE_ERROR, backfill_sql, middle
from tests.billing.http import ts
from tests.billing.usage_data import make_records, nearest_rank, record_all

COLUMNS = ", ".join(f"{p}_{i}" for p in ("lat", "ttft") for i in range(BUCKETS))


@pytest.fixture
async def entries(ledger):
    return await record_all(ledger, make_records())


def oracle(entries) -> dict[tuple, list]:
    """(team, hour, model) -> [streamed tokens, their ms, latency counts..., ttft counts...], in plain Python."""
    out: dict[tuple, list] = defaultdict(lambda: [0, 0.0, *([0] * (2 * BUCKETS))])
    for e in entries:
        u = e.usage
        if u.status == "rejected":
            continue
        row = out[(u.team_id, math.floor(u.time / 3600) * 3600, u.model)]
        row[2 + sum(1 for edge in EDGES if edge <= u.latency_ms)] += 1
        if u.ttft_ms is not None:
            row[2 + BUCKETS + sum(1 for edge in EDGES if edge <= u.ttft_ms)] += 1
            if u.status == "ok" and u.latency_ms > u.ttft_ms:
                row[0] += u.completion_tokens
                row[1] += u.latency_ms - u.ttft_ms
    return dict(out)


async def stored(store, table: str = LATENCY) -> dict[tuple, list]:
    rows = await store.fetch(f"SELECT team_id, period, model, streamed_tokens, streamed_ms, {COLUMNS} FROM {table}",
                             [])
    return {(r[0], int(r[1]), r[2]): [int(r[3]), float(r[4]), *map(int, r[5:])] for r in rows}


def same(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for key, row in expected.items():
        assert got[key][0] == row[0] and got[key][2:] == row[2:], key
        assert got[key][1] == pytest.approx(row[1]), key


async def test_the_writer_keeps_the_histograms_equal_to_the_records(ledger, entries):
    expected = oracle(entries)
    assert len(expected) > 100
    same(await stored(ledger.store), expected)
    # a replayed batch adds nothing
    assert await ledger.store.insert(entries[:30]) == 0
    same(await stored(ledger.store), expected)


async def test_the_failures_rollup_equals_the_records(ledger, entries):
    expected: dict[tuple, int] = defaultdict(int)
    for e in entries:
        u = e.usage
        if u.status in ("error", "rejected"):
            expected[(u.team_id, math.floor(u.time / 3600) * 3600, u.model, u.status, u.error_status or 0)] += 1
    rows = await ledger.store.fetch(f"SELECT {', '.join(failure_rollup.KEY)}, requests FROM {failure_rollup.FAILURES}",
                                    [])
    assert {(t, int(p), m, s, int(es)): int(n) for t, p, m, s, es, n in rows} == expected and len(expected) > 50
    # the migration's SQL fills the same rows from the records
    store = ledger.store
    await _execute(store, f"DELETE FROM {failure_rollup.FAILURES}")
    await _execute(store, failure_rollup.migration(store.dialect, "BIGINT")[1])
    assert sorted(await store.fetch(f"SELECT * FROM {failure_rollup.FAILURES}", [])) == sorted(rows)


async def test_the_migration_backfill_equals_the_writer(ledger, entries):
    """The migration's SQL (nested CASE over the edges) bins as the writer's bisect does, the edges included."""
    store = ledger.store
    copy = f"{LATENCY}_copy"
    await _execute(store, f"CREATE TABLE {copy} AS SELECT * FROM {LATENCY} WHERE 1 = 0")
    await _execute(store, backfill_sql(store.dialect).replace(f"INSERT INTO {LATENCY} ", f"INSERT INTO {copy} ", 1))
    same(await stored(store, copy), await stored(store))


async def _execute(store, sql: str) -> None:
    async with store._db.transaction() as tx:  # a statement no store method issues
        await tx.execute(sql)


def test_bucket_edges_and_the_error_bound():
    assert 0.048 < RELATIVE_ERROR < 0.049 and EDGES[0] == 1.0 and EDGES[-1] > 4e6
    for value in (1.0, 1.05, 1.1, 17.3, 999.999, 1000.0, 123_456.7, 4e6):
        i = bisect.bisect_right(EDGES, value)
        assert EDGES[i - 1] <= value < (EDGES[i] if i < len(EDGES) else math.inf)
        assert abs(middle(i) - value) <= RELATIVE_ERROR * value
    assert middle(0) == 0.5
    counts = [0] * BUCKETS
    counts[3], counts[10] = 95, 5
    p = percentiles_of(counts)
    assert (p.samples, p.p50, p.p95, p.p99) == (100, middle(3), middle(3), middle(10))
    assert percentiles_of([0] * BUCKETS).samples == 0


def close(approx, exact) -> bool:
    if exact is None:
        return approx is None
    return abs(approx - exact) <= (RELATIVE_ERROR * exact if exact >= EDGES[0] else 0.5) + 1e-9


@pytest.mark.parametrize(("granularity", "tz", "filters"), [("hour", "UTC", Filters()),
                                                           ("day", "America/New_York", Filters(models=("big",)))])
async def test_histogram_percentiles_stay_within_the_bound_of_the_exact_ones(ledger, entries, granularity, tz,
                                                                             filters):
    # partial hours at both ends: those come from the records
    start, end = ts("2025-03-03T05:17:00"), ts("2025-03-12T19:40:30")
    selection = Selection(start, end, "team-a", filters)
    bucketing = bucketing_for(selection, granularity, tz)
    exact, exact_overall = await timings(ledger.store, selection, bucketing, exact_up_to=10**9)
    approx, approx_overall = await timings(ledger.store, selection, bucketing, exact_up_to=0)
    assert approx.approximate and not exact.approximate
    pairs = [(exact, approx), *zip(exact.by_model, approx.by_model, strict=True)]
    checked = 0
    for want, got in pairs:
        for column in ("latency_ms", "ttft_ms"):
            for w, g in zip(getattr(want, column), getattr(got, column), strict=True):
                assert w.samples == g.samples
                for name in ("p50", "p95", "p99"):
                    assert close(getattr(g, name), getattr(w, name)), (column, name, w, g)
                    checked += w.samples > 0
        assert got.output_tokens_per_s == pytest.approx(want.output_tokens_per_s)
    assert checked > 50
    for column in ("latency_ms", "ttft_ms"):
        w, g = exact_overall[column], approx_overall[column]
        assert w.samples == g.samples > 0
        for name in ("p50", "p95", "p99"):
            assert close(getattr(g, name), getattr(w, name))
    assert approx.errors_by_status == exact.errors_by_status
    # the exact path is what the records say (as test_timings checks in depth)
    values = [e.usage.latency_ms for e in entries if e.usage.team_id == "team-a" and start <= e.usage.time < end
              and e.usage.status != "rejected" and (not filters.models or e.usage.model in filters.models)]
    assert exact_overall["latency_ms"].p95 == nearest_rank(values, 0.95)
