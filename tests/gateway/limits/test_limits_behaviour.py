"""Behaviour of the limiter, identical for the in-process and Redis backends (manual clock, no sleeps)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.limits import LimitExceeded, LimitScope

from .manual_clock import ManualClock


async def refused(limiter, scopes, tokens, sequences: int = 1) -> LimitExceeded:
    with pytest.raises(LimitExceeded) as info:
        await limiter.admit(scopes, tokens, sequences)
    return info.value


async def test_rpm_burst_then_exact_retry(limiter, clock):
    key = [LimitScope("key:a", rpm=3)]
    for _ in range(3):  # the whole minute's allowance is available at once
        await limiter.admit(key, 0)
        clock.advance(10)
    err = await refused(limiter, key, 0)
    assert err.kind == "rate_limit"
    assert err.retry_after == pytest.approx(30.0)  # first admission (t=0) leaves the window at t=60
    assert err.headers["retry-after"] == "30" and err.headers["retry-after-ms"] == "30000"
    assert err.headers["x-ratelimit-remaining-requests"] == "0"
    clock.advance(err.retry_after - 0.000001)
    await refused(limiter, key, 0)
    clock.advance(0.000001)
    await limiter.admit(key, 0)


async def test_tpm_reservation_and_refund(limiter, clock):
    key = [LimitScope("key:a", tpm=1000)]
    t1 = await limiter.admit(key, 600)
    assert t1.headers()["x-ratelimit-remaining-tokens"] == "400"
    err = await refused(limiter, key, 500)
    assert err.kind == "rate_limit" and err.retry_after == pytest.approx(60.0)
    await limiter.settle(t1, 100)  # 500 reserved-but-unused tokens come back
    t2 = await limiter.admit(key, 500)
    assert t2.headers()["x-ratelimit-remaining-tokens"] == "400"
    await limiter.settle(t1, 0)  # a second settle is a no-op
    await refused(limiter, key, 401)


async def test_reservation_larger_than_a_limit_never_fits(limiter):
    err = await refused(limiter, [LimitScope("key:a", tpm=100), LimitScope("team:t", tpm=10_000)], 101)
    assert err.kind == "never_fits" and err.retry_after is None
    assert "100 tokens-per-minute limit of key:a" in err.message
    assert "retry-after" not in err.headers and err.headers["x-ratelimit-limit-tokens"] == "100"
    assert (await refused(limiter, [LimitScope("key:a", rpm=0)], 1)).kind == "never_fits"


async def test_all_scopes_or_nothing(limiter, clock):
    key, team = LimitScope("key:a", rpm=5, tpm=1000), LimitScope("team:t", rpm=1)
    await limiter.admit([key, team], 100)
    err = await refused(limiter, [key, team], 100)
    assert "team:t" in err.message and "key:a" not in err.message
    # the refused request charged nothing to key:a: it still has 4 requests and 900 tokens
    ticket = await limiter.admit([key], 100)
    assert ticket.headers()["x-ratelimit-remaining-requests"] == "3"
    assert ticket.headers()["x-ratelimit-remaining-tokens"] == "800"


async def test_headers_report_the_tightest_scope(limiter, clock):
    key, team = LimitScope("key:a", rpm=100, tpm=500), LimitScope("team:t", rpm=10, tpm=100_000)
    first = await limiter.admit([key, team], 200)
    h = first.headers()
    assert (h["x-ratelimit-limit-requests"], h["x-ratelimit-remaining-requests"]) == ("10", "9")
    assert (h["x-ratelimit-limit-tokens"], h["x-ratelimit-remaining-tokens"]) == ("500", "300")
    assert h["x-ratelimit-reset-requests"] == "1m0s"
    clock.advance(15)
    h = (await limiter.admit([key, team], 0)).headers()
    assert h["x-ratelimit-reset-requests"] == "45s"  # when the oldest admission leaves the window


async def test_concurrency_cap_and_release(limiter, clock):
    key = [LimitScope("key:a", max_concurrency=2)]
    a = await limiter.admit(key, 0)
    await limiter.admit(key, 0)
    err = await refused(limiter, key, 0)
    assert err.kind == "concurrency" and err.retry_after == 1.0
    await limiter.settle(a, 0)
    await limiter.admit(key, 0)


async def test_unsettled_slot_is_reclaimed_after_its_lease(limiter, clock):
    key = [LimitScope("key:a", max_concurrency=1)]
    await limiter.admit(key, 0)  # its gateway "crashes": no settle ever comes
    clock.advance(299.999)
    await refused(limiter, key, 0)
    clock.advance(0.001)  # the fixture's lease is 300 s
    await limiter.admit(key, 0)


async def test_concurrency_counts_sequences_not_requests(limiter, clock):
    key = [LimitScope("key:a", max_concurrency=8), LimitScope("team:t", max_concurrency=100)]
    five = await limiter.admit(key, 0, sequences=5)  # e.g. 5 prompts, or one prompt with n=5
    three = await limiter.admit(key, 0, sequences=3)
    err = await refused(limiter, key, 0)  # one more sequence would be the 9th
    assert err.kind == "concurrency" and "8 of its 8 concurrent sequences" in err.message
    await limiter.settle(five, 0)  # every slot of the ticket comes back
    await limiter.admit(key, 0, sequences=5)
    await refused(limiter, key, 0)
    await limiter.settle(three, 0)
    await limiter.admit(key, 0, sequences=3)


async def test_a_request_larger_than_the_cap_runs_alone(limiter, clock):
    key = [LimitScope("key:a", max_concurrency=4)]
    one = await limiter.admit(key, 0)
    await refused(limiter, key, 0, sequences=100)  # it would need every slot
    await limiter.settle(one, 0)
    big = await limiter.admit(key, 0, sequences=100)  # alone, it holds all four
    await refused(limiter, key, 0)
    await limiter.settle(big, 0)
    await limiter.admit(key, 0, sequences=4)


async def test_every_slot_of_an_unsettled_ticket_is_reclaimed_after_its_lease(limiter, clock):
    key = [LimitScope("key:a", max_concurrency=3)]
    await limiter.admit(key, 0, sequences=3)  # its gateway "crashes"
    clock.advance(300)
    await limiter.admit(key, 0, sequences=3)


async def test_degenerate_inputs(limiter):
    with pytest.raises(ValueError):
        await limiter.admit([LimitScope("key:a")], -1)
    ticket = await limiter.admit([], 10)  # nothing limits: admitted, no headers
    assert ticket.headers() == {}
    await limiter.settle(ticket, 10)
    ticket = await limiter.admit([LimitScope("key:a")], 10)
    with pytest.raises(ValueError):
        await limiter.settle(ticket, -5)


async def test_overrun_is_charged(limiter):
    key = [LimitScope("key:a", tpm=100)]
    t = await limiter.admit(key, 10)
    await limiter.settle(t, 60)  # used more than reserved: the actual count is what is charged
    await refused(limiter, key, 41)
    await limiter.admit(key, 40)


def test_manual_clock_round_trips_exactly():
    clock = ManualClock(datetime(2025, 3, 14, tzinfo=UTC))
    assert round(clock() * 1_000_000) == clock.us
