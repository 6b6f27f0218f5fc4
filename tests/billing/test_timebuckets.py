"""Local-time buckets across DST changes, against zoneinfo, and through the usage API on both stores."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from billing.timebuckets import Bucketing, ZoneError, offset_spans, zone
from tests.billing.factory import usage
from tests.billing.http import auth, ts, usage_client


def hours(b) -> float:
    return (b.end - b.start) / 3600


def test_new_york_days_are_23_and_25_hours_long_on_dst_changes():
    spring = Bucketing("day", "America/New_York", ts("2025-03-08T12:00:00"), ts("2025-03-11T00:00:00"))
    assert [(b.label, hours(b)) for b in spring.all()] == [
        ("2025-03-08", 24), ("2025-03-09", 23), ("2025-03-10", 24)]
    fall = Bucketing("day", "America/New_York", ts("2025-11-01T12:00:00"), ts("2025-11-04T00:00:00"))
    assert [(b.label, hours(b)) for b in fall.all()] == [
        ("2025-11-01", 24), ("2025-11-02", 25), ("2025-11-03", 24)]
    for b in [*spring.all(), *fall.all()]:  # each day starts at its local midnight
        local = datetime.fromtimestamp(b.start, ZoneInfo("America/New_York"))
        assert (local.hour, local.minute, local.date().isoformat()) == (0, 0, b.label)


def test_the_repeated_hour_is_two_buckets_and_the_skipped_hour_none():
    fall = Bucketing("hour", "America/New_York", ts("2025-11-02T04:00:00"), ts("2025-11-02T08:00:00"))
    assert [b.label for b in fall.all()] == ["2025-11-02T00:00:00-04:00", "2025-11-02T01:00:00-04:00",
                                             "2025-11-02T01:00:00-05:00", "2025-11-02T02:00:00-05:00"]
    spring = Bucketing("hour", "America/New_York", ts("2025-03-09T05:00:00"), ts("2025-03-09T09:00:00"))
    assert [b.label for b in spring.all()] == ["2025-03-09T00:00:00-05:00", "2025-03-09T01:00:00-05:00",
                                               "2025-03-09T03:00:00-04:00", "2025-03-09T04:00:00-04:00"]
    assert all(hours(b) == 1 for b in [*fall.all(), *spring.all()])


def test_hours_in_steps_cover_the_window_once_across_a_dst_change():
    """A long hourly view drawn at a chart's width (billing/insights/overview.py `max_points`): 3-hour buckets of
    the local clock, the one the fall-back cuts in two spans, and no gap or overlap."""
    fall = Bucketing("hour", "America/New_York", ts("2025-11-01T04:00:00"), ts("2025-11-03T05:00:00"), step=3)
    buckets = fall.all()
    assert buckets[0].label == "2025-11-01T00:00:00-04:00" and buckets[1].label == "2025-11-01T03:00:00-04:00"
    assert all(a.end == b.start for a, b in zip(buckets, buckets[1:], strict=False))
    assert buckets[0].start == ts("2025-11-01T04:00:00") and buckets[-1].end == ts("2025-11-03T05:00:00")
    assert sum(hours(b) for b in buckets) == 49 and all(hours(b) <= 3 for b in buckets)  # two local days + 1 h
    assert {"2025-11-02T00:00:00-04:00", "2025-11-02T00:00:00-05:00"} <= {b.label for b in buckets}
    assert fall.aligned(3600) and len(buckets) <= fall.count()
    with pytest.raises(ValueError, match="only hours"):
        Bucketing("day", "UTC", 0, 86400, step=2)


def test_half_hour_zones_and_half_hour_shifts():
    india = Bucketing("hour", "Asia/Kolkata", ts("2025-06-01T00:00:00"), ts("2025-06-01T02:00:00"))
    assert [datetime.fromtimestamp(b.start, UTC).minute for b in india.all()] == [30, 30, 30]
    # Lord Howe falls back half an hour: 02:00 +11:00 becomes 01:30 +10:30
    howe = Bucketing("hour", "Australia/Lord_Howe", ts("2025-04-05T14:00:00"), ts("2025-04-05T16:00:00"))
    assert [(b.label, hours(b)) for b in howe.all()] == [
        ("2025-04-06T01:00:00+11:00", 1), ("2025-04-06T01:00:00+10:30", 0.5), ("2025-04-06T02:00:00+10:30", 1)]
    assert not howe.aligned(3600) and Bucketing("day", "UTC", 0, 86400).aligned(86400)


def test_offset_spans_find_every_transition_of_a_year():
    spans = offset_spans(zone("Europe/Paris"), ts("2025-01-01"), ts("2026-01-01"))
    assert [(s.offset // 3600) for s in spans] == [1, 2, 1]
    assert [datetime.fromtimestamp(s.start, UTC).isoformat() for s in spans[1:]] == [
        "2025-03-30T01:00:00+00:00", "2025-10-26T01:00:00+00:00"]
    assert len(offset_spans(zone("UTC"), 0, 4e9)) == 1


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../etc/passwd", "Europe", "x" * 100, "Europe/Paris\x00"])
def test_unknown_zones_are_refused(name):
    with pytest.raises(ZoneError):
        zone(name)


# records a minute either side of each local midnight and of each transition, in March and November
EDGES = ["2025-03-08T04:59:00", "2025-03-08T05:01:00", "2025-03-09T04:59:00", "2025-03-09T05:01:00",
         "2025-03-09T06:59:00", "2025-03-09T07:01:00", "2025-03-10T03:59:00", "2025-03-10T04:01:00",
         "2025-11-02T03:59:00", "2025-11-02T04:01:00", "2025-11-02T05:30:00", "2025-11-02T06:30:00",
         "2025-11-03T04:59:00", "2025-11-03T05:01:00"]


@pytest.mark.parametrize("tz", ["America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "UTC"])
async def test_usage_api_groups_by_local_day_and_hour(ledger, tz):
    for i, text in enumerate(EDGES):
        await ledger.record(usage(request_id=f"edge-{i}", team_id="team-a", time=ts(text), prompt_tokens=i + 1))
    await ledger.flush(10)
    local = ZoneInfo(tz)
    moments = [datetime.fromtimestamp(ts(t), local) for t in EDGES]
    async with usage_client(ledger) as client:
        for group_by, label in (("day", lambda m: m.date().isoformat()),
                                ("hour", lambda m: m.replace(minute=0, second=0).isoformat())):
            expected: dict[str, int] = {}
            for i, m in enumerate(moments):
                expected[label(m)] = expected.get(label(m), 0) + i + 1
            r = await client.get("/v1/usage", headers=auth("a"), params={
                "start": "2025-03-01", "end": "2025-11-30", "group_by": group_by, "tz": tz})
            assert r.status_code == 200, r.text
            assert {row["key"]: row["prompt_tokens"] for row in r.json()["rows"]} == expected
            assert [row["key"] for row in r.json()["rows"]] == list(expected)  # EDGES run forward in time
