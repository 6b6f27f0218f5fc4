"""The dashboards' queries on both stores: every number equals the usage API for the same selection
(through HTTP) and the plain sums of the records (computed here in Python)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from billing.filters import NO_USER, Filters, Selection
from billing.insights.month import month_to_date
from billing.insights.overview import overview
from billing.insights.ranking import team_ranking
from billing.records import BUDGET_REFUSED
from tests.billing.factory import usage
from tests.billing.http import auth, ts, usage_client
from tests.billing.usage_data import (
    KEYS,
    local_day,
    local_hour,
    make_records,
    nearest_rank,
    record_all,
    selected,
    sums,
)

# partial days at both ends (rollups inside, records at the edges), whole days, and a few minutes
WINDOWS = [(ts("2025-03-03T05:17:00"), ts("2025-04-08T19:40:30")), (ts("2025-03-01"), ts("2025-04-11")),
           (ts("2025-03-09T23:55:00"), ts("2025-03-10T00:05:00"))]
FILTERS = [Filters(), Filters(models=("big",)), Filters(key_ids=("key-a", "key-deleted"), statuses=("ok", "rejected")),
           Filters(user_ids=(NO_USER,)), Filters(user_ids=(NO_USER, "usr_2"), dialects=("tgi",), adapters=("",))]
PARAMS = {"models": "model", "key_ids": "key_id", "user_ids": "user_id", "dialects": "dialect", "statuses": "status",
          "adapters": "adapter"}


@pytest.fixture
async def entries(ledger):
    return await record_all(ledger, make_records())


def query_params(selection: Selection, **extra) -> list[tuple[str, str]]:
    params = [("start", _iso(selection.start)), ("end", _iso(selection.end))]
    for field, name in PARAMS.items():
        params += [(name, v or "-") for v in getattr(selection.filters, field)]  # adapter "": `-`
    return params + list(extra.items())


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat()


def row_tuple(row) -> tuple:
    return (row["requests"], row["prompt_tokens"], row["completion_tokens"], row["compute_tokens"], row["cost_micros"])


def sums_tuple(s) -> tuple:
    return (s.requests, s.prompt_tokens, s.completion_tokens, s.compute_tokens, s.cost_micros)


async def test_overview_equals_usage_api_and_records(ledger, entries):
    async with usage_client(ledger) as client:
        for window in WINDOWS:
            for filters in FILTERS:
                await check_overview(ledger, client, entries, Selection(*window, "team-a", filters))


async def check_overview(ledger, client, entries, selection):
    view = await overview(ledger.store, selection, "day", "UTC")
    rows = selected(entries, selection)
    for group_by, breakdown, key in (("none", [view.totals], lambda e: ""),
                                     ("model", view.by_model, lambda e: e.usage.model),
                                     ("key", view.by_key, lambda e: e.usage.key_id),
                                     ("user", view.by_user, lambda e: e.usage.user_id or NO_USER)):
        r = await client.get("/v1/usage", params=query_params(selection, group_by=group_by), headers=auth("a"))
        assert r.status_code == 200, r.text
        api = {row["key"]: row_tuple(row) for row in r.json()["rows"]}
        expected = sums(rows, key)
        if group_by == "none":
            assert api == ({"": expected[""]} if rows else {}), selection
            assert sums_tuple(view.totals) == expected.get("", (0, 0, 0, 0, 0))
        else:
            assert api == expected, (group_by, selection)
            assert {s.key: sums_tuple(s) for s in breakdown} == expected
    r = await client.get("/v1/usage", params=query_params(selection, group_by="day"), headers=auth("a"))
    by_day = {row["key"]: row_tuple(row) for row in r.json()["rows"]}
    assert by_day == sums(rows, lambda e: local_day(e, "UTC"))
    # the series: per day, summed over the models, equals the usage API's days
    series = {}
    for i, bucket in enumerate(view.series.buckets):
        per_model = [(m.requests[i], m.prompt_tokens[i], m.completion_tokens[i], m.compute_tokens[i], m.cost_micros[i])
                     for m in view.series.by_group]
        total = tuple(map(sum, zip(*per_model, strict=True))) if per_model else (0,) * 5
        if total[0]:
            series[bucket.label] = total
    assert series == by_day
    # how requests ended, the 429s, cold starts and percentiles, from the records themselves
    t = view.totals
    assert (t.ok, t.cancelled, t.errors, t.rejected) == tuple(
        sum(e.usage.status == s for e in rows) for s in ("ok", "cancelled", "error", "rejected"))
    rate_limited = sum(e.usage.error_status == 429 and e.usage.error_code != BUDGET_REFUSED for e in rows)
    assert t.rate_limited == rate_limited == sum(view.series.rate_limited)
    budget_refused = sum(e.usage.error_code == BUDGET_REFUSED for e in rows)  # 429 or 402, never a rate limit
    assert t.budget_refused == budget_refused == sum(view.series.budget_refused)
    assert view.error_rate == ((t.errors + t.rejected) / t.requests if t.requests else 0.0)
    colds = [e.usage.cold_start_ms for e in rows if e.usage.cold_start_ms is not None]
    assert sum(view.series.cold_starts) == len(colds)
    assert sum(view.series.cold_start_ms_total) == pytest.approx(sum(colds))
    assert max((m for m in view.series.cold_start_ms_max if m is not None), default=None) == max(colds, default=None)
    reached = [e for e in rows if e.usage.status != "rejected"]
    latencies = [e.usage.latency_ms for e in reached]
    ttfts = [e.usage.ttft_ms for e in reached if e.usage.ttft_ms is not None]
    assert (view.latency_ms.samples, view.latency_ms.p50, view.latency_ms.p95) == (
        len(latencies), nearest_rank(latencies, 0.5), nearest_rank(latencies, 0.95))
    assert (view.ttft_ms.samples, view.ttft_ms.p50, view.ttft_ms.p95) == (
        len(ttfts), nearest_rank(ttfts, 0.5), nearest_rank(ttfts, 0.95))


async def test_deleted_keys_and_users_stay_in_past_totals(ledger, entries):
    # the auth side forgot key-deleted and usr_gone; the ledger keeps their ids and their usage
    view = await overview(ledger.store, Selection(*WINDOWS[1], "team-a"))
    keys = {s.key: s.requests for s in view.by_key}
    users = {s.key: s.requests for s in view.by_user}
    expected = sum(e.usage.key_id == "key-deleted" for e in entries)
    assert keys["key-deleted"] == users["usr_gone"] == expected > 0
    assert users[NO_USER] == sum(e.usage.key_id == "key-svc" for e in entries) > 0  # service keys
    assert view.by_key == sorted(view.by_key, key=lambda s: (-s.cost_micros, -s.requests, s.key))


async def test_a_team_sees_only_its_own_usage(ledger, entries):
    a = await overview(ledger.store, Selection(*WINDOWS[1], "team-a"))
    b = await overview(ledger.store, Selection(*WINDOWS[1], "team-b"))
    assert {s.key for s in a.by_key} <= {k for k, _ in KEYS["team-a"]}
    assert {s.key for s in b.by_key} == {"key-b"}
    assert a.totals.requests + b.totals.requests == len(selected(entries, Selection(*WINDOWS[1])))


async def test_team_ranking_is_every_team_by_cost(ledger, entries):
    ranking = await team_ranking(ledger.store, Selection(*WINDOWS[0]))
    expected = sums(selected(entries, Selection(*WINDOWS[0])), lambda e: e.usage.team_id)
    assert {s.key: sums_tuple(s) for s in ranking} == expected
    assert [s.key for s in ranking] == sorted(expected, key=lambda k: (-expected[k][4], -expected[k][0], k))
    assert [s.key for s in await team_ranking(ledger.store, Selection(*WINDOWS[0]), limit=1)] == [ranking[0].key]


async def test_hourly_series_in_a_zone_equals_the_records(ledger, entries):
    start, end = ts("2025-03-08T00:00:00"), ts("2025-03-11T00:00:00")  # New York springs forward on 03-09
    view = await overview(ledger.store, Selection(start, end, "team-a"), "hour", "America/New_York")
    rows = selected(entries, Selection(start, end, "team-a"))
    got = {}
    for i, bucket in enumerate(view.series.buckets):
        n = sum(m.requests[i] for m in view.series.by_group)
        if n:
            got[bucket.label] = n
        assert bucket.end - bucket.start == 3600
    assert got == {k: v[0] for k, v in sums(rows, lambda e: local_hour(e, "America/New_York")).items()}
    assert not any(b.label.startswith("2025-03-09T02:") for b in view.series.buckets)  # the skipped hour


async def test_month_to_date_and_projection(ledger, entries):
    now = ts("2025-03-21T12:00:00")
    mtd = await month_to_date(ledger.store, "team-a", now, budget_tokens=1_000_000)
    month = selected(entries, Selection(ts("2025-03-01"), now, "team-a"))
    trailing = selected(entries, Selection(now - 7 * 86400, now, "team-a"))
    used = sum(e.usage.prompt_tokens + e.usage.compute_tokens for e in month)
    assert (mtd.month, mtd.budget_tokens_used, mtd.usage.requests) == ("2025-03", used, len(month))
    assert mtd.usage.cost_micros == sum(e.cost_micros for e in month)
    recent = sum(e.usage.prompt_tokens + e.usage.compute_tokens for e in trailing)
    remaining = ts("2025-04-01") - now
    assert mtd.rate_window_s == 7 * 86400  # the team is older than the trailing week
    assert mtd.projected_tokens == used + round(recent * remaining / (7 * 86400))
    assert mtd.used_fraction == used / 1_000_000
    if mtd.projected_tokens > 1_000_000 and used < 1_000_000:
        assert now < mtd.exhausted_at < ts("2025-04-01")
    # filters narrow it like any view
    big = await month_to_date(ledger.store, "team-a", now, filters=Filters(models=("big",)))
    assert big.usage.requests == sum(e.usage.model == "big" for e in month)


async def test_month_to_date_of_a_young_team_measures_its_own_life(ledger):
    now = ts("2025-06-10T00:00:00")
    for hours_ago in (48, 24, 1):
        await ledger.record(usage(team_id="team-new", time=now - hours_ago * 3600, prompt_tokens=100,
                                  completion_tokens=50, compute_tokens=50))
    await ledger.flush(10)
    mtd = await month_to_date(ledger.store, "team-new", now)
    assert mtd.rate_window_s <= 3 * 86400  # since its first day, not a week of silence before it
    assert mtd.budget_tokens_used == 450 and mtd.projected_tokens > 450
    assert mtd.budget_tokens is None and mtd.exhausted_at is None


async def test_under_a_day_of_traffic_projects_nothing(ledger):
    """Issue 44: an hour's usage carried over the month read $0.26 as $158.94 at the month's end. A team with
    less than a full day of history gets no projection; from a day on, its average rate over its whole life."""
    now = ts("2025-06-10T12:00:00")
    for minutes_ago in (60, 30, 1):
        await ledger.record(usage(team_id="team-hour", time=now - minutes_ago * 60, prompt_tokens=100,
                                  completion_tokens=50, compute_tokens=50))
    await ledger.flush(10)
    mtd = await month_to_date(ledger.store, "team-hour", now, budget_tokens=1000)
    assert mtd.budget_tokens_used == 450 and mtd.used_fraction == 0.45
    assert mtd.projected_tokens is None and mtd.projected_cost_micros is None
    assert mtd.projected_fraction is None and mtd.exhausted_at is None
    later = now + 86400 + 60 - 3600  # a day after its first request: the average over that day
    mtd = await month_to_date(ledger.store, "team-hour", later)
    assert mtd.rate_window_s == pytest.approx(86400 + 60)
    remaining = ts("2025-07-01") - later
    assert mtd.projected_tokens == 450 + round(450 * remaining / (86400 + 60))


async def test_overview_and_ranking_over_http(ledger, entries):
    selection = Selection(*WINDOWS[0], "team-a", Filters(models=("big", "small")))
    direct = await overview(ledger.store, selection, "day", "Europe/Paris")
    params = [*query_params(selection), ("tz", "Europe/Paris"), ("granularity", "day")]
    async with usage_client(ledger) as client:
        mine = (await client.get("/v1/usage/overview", params=params, headers=auth("a"))).json()
        as_admin = (await client.get("/admin/usage/overview", params=[*params, ("team_id", "team-a")],
                                     headers=auth("root"))).json()
        teams = (await client.get("/admin/usage/teams", params=query_params(Selection(*WINDOWS[0])),
                                  headers=auth("root"))).json()
        short = (await client.get("/v1/usage/overview", params={"start": "2025-03-05", "end": "2025-03-06"},
                                  headers=auth("a"))).json()
        refused = [await client.get(path, params=p, headers=auth(who)) for path, p, who in (
            ("/v1/usage/overview", {"start": "2025-01-01", "end": "2026-12-31", "granularity": "hour"}, "a"),
            ("/v1/usage/overview", {"granularity": "fortnight"}, "a"),
            ("/v1/usage/overview", {"tz": "Nowhere/Land"}, "a"),
            ("/admin/usage/teams", {"start": "tomorrow"}, "root"))]
        forbidden = await client.get("/admin/usage/overview", headers=auth("a"))
    assert mine["totals"]["cost_micros"] == direct.totals.cost_micros
    assert [b["label"] for b in mine["series"]["buckets"]] == [b.label for b in direct.series.buckets]
    assert mine["series"]["tz"] == "Europe/Paris" and mine == as_admin
    assert short["series"]["granularity"] == "hour" and len(short["series"]["buckets"]) == 48  # end date included
    ranking = await team_ranking(ledger.store, Selection(*WINDOWS[0]))
    assert [(t["key"], t["cost_micros"]) for t in teams["data"]] == [(t.key, t.cost_micros) for t in ranking]
    assert [(r.status_code, r.json()["error"]["param"]) for r in refused] == [
        (400, "granularity"), (400, "granularity"), (400, "tz"), (400, "start")]
    assert forbidden.status_code == 403
