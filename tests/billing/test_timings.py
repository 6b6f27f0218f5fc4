"""The overview's series beyond sums, on both stores, checked against plain Python over the records:
latency and time-to-first-token percentiles (p50/p95/p99, nearest rank) per bucket, output tokens per
second and failures by HTTP status per bucket, all models together and each model on its own; week (from
Monday) and month buckets in a zone; the series split by another column; the previous period's totals
(equal to the usage API's over that window)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from billing.filters import NO_USER, Filters, Selection
from billing.insights.overview import overview, previous_period
from billing.timebuckets import Bucketing
from tests.billing.http import auth, ts, usage_client
from tests.billing.test_insights import query_params, row_tuple, sums_tuple
from tests.billing.usage_data import make_records, nearest_rank, record_all, selected, sums

WINDOW = (ts("2025-03-03T05:17:00"), ts("2025-04-08T19:40:30"))
VIEWS = [("day", "UTC", Filters()), ("hour", "America/New_York", Filters(models=("big",))),
         ("week", "Asia/Kolkata", Filters()), ("month", "America/New_York", Filters(statuses=("ok", "rejected"))),
         ("week", "UTC", Filters(user_ids=(NO_USER,)))]


@pytest.fixture
async def entries(ledger):
    return await record_all(ledger, make_records())


def bucket_of(buckets, t: float) -> int:
    (i,) = [i for i, b in enumerate(buckets) if b.start <= t < b.end]
    return i


class Oracle:
    """Plain Python over the records: latency and ttft values, streamed tokens and their ms, per bucket."""

    def __init__(self) -> None:
        self.latency, self.ttft = defaultdict(list), defaultdict(list)
        self.tokens, self.spent = defaultdict(int), defaultdict(float)

    def add(self, u, i: int) -> None:
        self.latency[i].append(u.latency_ms)
        if u.ttft_ms is not None:
            self.ttft[i].append(u.ttft_ms)
            if u.status == "ok" and u.latency_ms > u.ttft_ms:
                self.tokens[i] += u.completion_tokens
                self.spent[i] += u.latency_ms - u.ttft_ms

    def check(self, got, buckets, what: str) -> None:
        """`got` (Timings or ModelTimings) equals this oracle in every bucket."""
        for i in range(len(buckets)):
            for measured, values in ((got.latency_ms[i], self.latency[i]), (got.ttft_ms[i], self.ttft[i])):
                assert (measured.samples, measured.p50, measured.p95, measured.p99) == (
                    len(values), *(nearest_rank(values, f) for f in (0.5, 0.95, 0.99))), (what, i, buckets[i].label)
            expected_rate = self.tokens[i] * 1000 / self.spent[i] if self.spent[i] else None
            assert got.output_tokens_per_s[i] == pytest.approx(expected_rate), (what, i)


@pytest.mark.parametrize(("granularity", "tz", "filters"), VIEWS)
async def test_timings_per_bucket_equal_the_records(ledger, entries, granularity, tz, filters):
    """All models together, and each model on its own (the charts' line per model), bucket by bucket."""
    start, end = WINDOW if granularity != "hour" else (ts("2025-03-08T00:00:00"), ts("2025-03-11T00:00:00"))
    selection = Selection(start, end, "team-a", filters)
    view = await overview(ledger.store, selection, granularity, tz)
    rows = selected(entries, selection)
    buckets = view.series.buckets
    everything, by_model = Oracle(), defaultdict(Oracle)
    failed = defaultdict(lambda: defaultdict(int))
    for e in rows:
        u, i = e.usage, bucket_of(buckets, e.usage.time)
        if u.status in ("error", "rejected"):
            failed[str(u.error_status) if u.error_status else "other"][i] += 1
        if u.status == "rejected":
            continue
        everything.add(u, i)
        by_model[u.model].add(u, i)
    assert rows and len(everything.latency) > 1
    everything.check(view.timings, buckets, "all models")
    assert [m.model for m in view.timings.by_model] == sorted(by_model)
    assert len(by_model) == (1 if filters.models else 3)
    for line in view.timings.by_model:
        by_model[line.model].check(line, buckets, line.model)
    assert {s: {i: n for i, n in enumerate(v) if n} for s, v in view.timings.errors_by_status.items()} == {
        s: dict(v) for s, v in failed.items()}
    reached = [e.usage.latency_ms for e in rows if e.usage.status != "rejected"]
    assert view.latency_ms.p99 == nearest_rank(reached, 0.99)
    assert view.ttft_ms.p50 == nearest_rank([e.usage.ttft_ms for e in rows if e.usage.status != "rejected"
                                             and e.usage.ttft_ms is not None], 0.5)


@pytest.mark.parametrize(("granularity", "tz"), [("week", "Asia/Kolkata"), ("week", "UTC"),
                                                 ("month", "America/New_York"), ("month", "UTC")])
async def test_week_and_month_buckets_follow_the_zones_calendar(ledger, entries, granularity, tz):
    selection = Selection(*WINDOW, "team-a")
    view = await overview(ledger.store, selection, granularity, tz)
    zone = ZoneInfo(tz)

    def period(e) -> str:
        day = datetime.fromtimestamp(e.usage.time, zone).date()
        return (day - timedelta(days=day.weekday())).isoformat() if granularity == "week" else day.isoformat()[:7]

    expected = sums(selected(entries, selection), period)
    got = {}
    for i, b in enumerate(view.series.buckets):
        first = datetime.fromtimestamp(b.start, zone)
        assert (first.hour, first.minute) == (0, 0)  # a local midnight
        assert first.weekday() == 0 if granularity == "week" else first.day == 1
        per_group = [(m.requests[i], m.prompt_tokens[i], m.completion_tokens[i], m.compute_tokens[i],
                      m.cost_micros[i]) for m in view.series.by_group]
        total = tuple(map(sum, zip(*per_group, strict=True)))
        if total[0]:
            got[b.label] = total
    assert got == expected
    assert [b.end for b in view.series.buckets[:-1]] == [b.start for b in view.series.buckets[1:]]


def test_a_month_bucket_in_a_zone_starts_at_its_local_midnight():
    b = Bucketing("month", "America/New_York", ts("2025-03-05"), ts("2025-04-20")).all()
    assert [x.label for x in b] == ["2025-03", "2025-04"]
    assert b[1].start == ts("2025-04-01T04:00:00")  # EDT, after the March DST change
    assert b[0].start == ts("2025-03-01T05:00:00")  # EST


@pytest.mark.parametrize("group_by", ["key", "user", "dialect", "endpoint", "adapter"])
async def test_the_series_split_by_another_column(ledger, entries, group_by):
    selection = Selection(*WINDOW, "team-a", Filters(models=("big", "small")))
    view = await overview(ledger.store, selection, "day", "Europe/Paris", group_by)
    column = {"key": "key_id", "user": "user_id", "dialect": "dialect", "endpoint": "route", "adapter": "adapter"}
    expected = sums(selected(entries, selection),
                    lambda e: getattr(e.usage, column[group_by]) or NO_USER)
    got = {g.key: (sum(g.requests), sum(g.prompt_tokens), sum(g.completion_tokens), sum(g.compute_tokens),
                   sum(g.cost_micros)) for g in view.series.by_group}
    assert got == expected and view.series.group_by == group_by


async def test_the_previous_period_equals_the_usage_api(ledger, entries):
    selection = Selection(ts("2025-03-20T06:00:00"), ts("2025-03-27T06:00:00"), "team-a", Filters(dialects=("tgi",)))
    view = await overview(ledger.store, selection)
    before = previous_period(selection)
    assert (before.start, before.end) == (ts("2025-03-13T06:00:00"), selection.start)
    async with usage_client(ledger) as client:
        r = await client.get("/v1/usage", params=query_params(before, group_by="none"), headers=auth("a"))
    (row,) = r.json()["rows"]
    assert sums_tuple(view.previous) == row_tuple(row) == sums(selected(entries, before))[""]
    failed = [e for e in selected(entries, before) if e.usage.status in ("error", "rejected")]
    assert view.previous.errors + view.previous.rejected == len(failed)


async def test_the_overview_api_takes_series_by_and_refuses_a_bad_one(ledger, entries):
    async with usage_client(ledger) as client:
        params = {"start": "2025-03-05", "end": "2025-03-20", "granularity": "week", "series_by": "dialect"}
        ok = await client.get("/v1/usage/overview", params=params, headers=auth("a"))
        bad = await client.get("/v1/usage/overview", params={**params, "series_by": "route"}, headers=auth("a"))
        worse = await client.get("/v1/usage/overview", params={**params, "granularity": "fortnight"},
                                 headers=auth("a"))
    assert ok.status_code == 200, ok.text
    assert {g["key"] for g in ok.json()["series"]["by_group"]} == {"openai", "tgi"}
    assert [b["label"] for b in ok.json()["series"]["buckets"]] == ["2025-03-03", "2025-03-10", "2025-03-17"]
    assert (bad.status_code, worse.status_code) == (400, 400)
    assert "series_by" in bad.text and "granularity" in worse.text
