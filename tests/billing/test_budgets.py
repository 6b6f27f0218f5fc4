"""Spend against budgets in money (billing/budgets.py): the period's window, the spend of a team and of a key
as the store holds it (and the tokens a monthly token budget counts), the thresholds reached, and the
insert-once record of alerts sent, which every gateway of a fleet shares through the database, and the fleet-wide
state of each health alert."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from billing.budgets import period_window, reached, spent_micros, spent_tokens
from billing.records import LedgerEntry
from billing.store import open_store
from tests.billing.factory import usage


def test_periods_are_utc_months_and_days():
    at = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
    month, day = period_window("month", at), period_window("day", at)
    assert (month.key, month.start, month.end) == (
        "2026-12", datetime(2026, 12, 1, tzinfo=UTC).timestamp(), datetime(2027, 1, 1, tzinfo=UTC).timestamp())
    assert (day.key, day.end) == ("2026-12-31", datetime(2027, 1, 1, tzinfo=UTC).timestamp())


def test_thresholds_reached():
    assert reached(0, 100) == [] and reached(49, 100) == []
    assert reached(50, 100) == [50] and reached(79, 100) == [50]
    assert reached(80, 100) == [50, 80] and reached(100, 100) == [50, 80, 100] and reached(500, 100) == [50, 80, 100]


async def test_spend_is_the_periods_cost_of_the_team_or_the_key(database_url):
    store = await open_store(database_url)
    try:
        now = time.time()
        window = period_window("day", now)
        entries = [LedgerEntry(usage(team_id="t1", key_id="k1", time=now - 5), 0, 0, 3_000_000, now),
                   LedgerEntry(usage(team_id="t1", key_id="k2", time=now - 5), 0, 0, 2_000_000, now),
                   LedgerEntry(usage(team_id="t2", key_id="k1", time=now - 5), 0, 0, 7_000_000, now),  # k1 elsewhere
                   LedgerEntry(usage(team_id="t1", key_id="k1", time=window.start - 1), 0, 0, 9_000_000, now)]
        await store.insert(entries)
        assert await spent_micros(store, "team:t1", window, now) == 5_000_000  # yesterday's is not today's
        assert await spent_micros(store, "key:k1", window, now) == 10_000_000  # a key's spend across its teams
        assert await spent_micros(store, "team:t1", period_window("month", now), now) == (
            14_000_000 if period_window("month", window.start - 1).key == period_window("month", now).key
            else 5_000_000)
        assert await spent_micros(store, "team:nobody", window, now) == 0
    finally:
        await store.close()


async def test_budget_tokens_are_the_months_prompt_and_compute_tokens(database_url):
    """What a monthly token budget counts (prompt + compute tokens, as the limiter charges), of the team or of
    the key across its teams."""
    store = await open_store(database_url)
    try:
        now = time.time()
        month = period_window("month", now)
        entries = [LedgerEntry(usage(team_id="t1", key_id="k1", time=now - 5, prompt_tokens=100, completion_tokens=7,
                                     compute_tokens=21), 0, 0, 0, now),
                   LedgerEntry(usage(team_id="t2", key_id="k1", time=now - 5, prompt_tokens=40, compute_tokens=2), 0,
                               0, 0, now),
                   LedgerEntry(usage(team_id="t1", key_id="k1", time=month.start - 1, prompt_tokens=999), 0, 0, 0,
                               now)]
        await store.insert(entries)
        assert await spent_tokens(store, "team:t1", month, now) == 121  # last month's is not this month's
        assert await spent_tokens(store, "key:k1", month, now) == 163
        assert await spent_tokens(store, "team:nobody", month, now) == 0
    finally:
        await store.close()


async def test_an_alert_is_recorded_once_for_every_store_on_the_database(database_url):
    first, second = await open_store(database_url), await open_store(database_url)
    try:
        assert await first.claim_alert("team:t1", "2026-11", 50, time.time())
        assert not await second.claim_alert("team:t1", "2026-11", 50, time.time())  # another gateway
        assert not await first.claim_alert("team:t1", "2026-11", 50, time.time())
        assert await second.claim_alert("team:t1", "2026-11", 80, time.time())  # another threshold
        assert await second.claim_alert("team:t1", "2026-12", 50, time.time())  # the next period
        assert await first.claim_alert("key:k1", "2026-11", 50, time.time())  # another scope
    finally:
        await first.close()
        await second.close()


async def test_a_health_alerts_state_is_the_fleets_and_moves_only_forward_in_time(database_url):
    """gateway/serving/health_alerts.py: whichever store fires a crossing first sends it; a judgement older than the
    one that set the state (another gateway's, late) changes nothing."""
    first, second = await open_store(database_url), await open_store(database_url)
    try:
        assert await first.set_health_state("team:t1", "error_rate", True, 10.0)  # fired: this one sends
        assert not await second.set_health_state("team:t1", "error_rate", True, 11.0)  # already fired
        assert not await second.set_health_state("team:t1", "error_rate", False, 9.0)  # a stale "below"
        assert await second.set_health_state("team:t1", "error_rate", False, 12.0)  # armed again
        assert not await first.set_health_state("team:t1", "error_rate", True, 11.5)  # a stale "above"
        assert await first.set_health_state("team:t1", "latency_p95", True, 11.5)  # another measure
        assert await second.set_health_state("team:t1", "error_rate", True, 13.0)  # the next crossing
        assert await second.set_health_state("team:t2", "error_rate", True, 13.0)  # another team
    finally:
        await first.close()
        await second.close()
