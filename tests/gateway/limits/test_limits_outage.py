"""Redis outage: the server is stopped mid-run and started again; the limiter fails open or closed as
configured, exposes it in metrics, and recovers by itself."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from gateway.limits import LimiterUnavailable, LimitExceeded, LimitScope, open_limiter, outage
from gateway.metrics import REGISTRY
from tests.logged import logged

SCOPES = [LimitScope("key:outage", rpm=100_000, max_concurrency=50)]


def errors(op: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("sluice_limiter_backend_errors_total",
                                     {"op": op, "outcome": outcome}) or 0.0


def backend_up() -> float | None:
    return REGISTRY.get_sample_value("sluice_limiter_backend_up")


async def drive(lim, stop: asyncio.Event, outcomes: list[str]) -> None:
    """A steady stream of admit/settle pairs, as a gateway under load would make."""
    while not stop.is_set():
        try:
            ticket = await lim.admit(SCOPES, 5)
        except LimiterUnavailable:
            outcomes.append("unavailable")
        except LimitExceeded:
            outcomes.append("limited")
        else:
            outcomes.append("degraded" if ticket.degraded else "ok")
            await lim.settle(ticket, 3)  # never raises, even while the server is down
        await asyncio.sleep(0.002)


async def wait_for(outcomes: list[str], what: str, since: int, timeout: float = 120.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while what not in outcomes[since:]:
        assert loop.time() < deadline, f"no {what!r} within {timeout}s; saw {set(outcomes[since:])}"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("fail_open", [True, False])
async def test_server_killed_mid_run_and_restarted(redis, fail_open):
    lim = open_limiter(redis.url, fail_open=fail_open, key_prefix=f"o:{uuid.uuid4().hex}")
    during = "degraded" if fail_open else "unavailable"
    outcome = "fail_open" if fail_open else "fail_closed"
    before_admit, before_settle = errors("admit", outcome), errors("settle", "dropped")
    outcomes: list[str] = []
    stop = asyncio.Event()
    driver = asyncio.create_task(drive(lim, stop, outcomes))
    try:
        await wait_for(outcomes, "ok", 0)
        redis.stop()
        try:
            mark = len(outcomes)
            await wait_for(outcomes, during, mark)
            assert backend_up() == 0
        finally:
            redis.start()
        mark = len(outcomes)
        await wait_for(outcomes, "ok", mark)  # recovers without a restart of the limiter
        assert backend_up() == 1
    finally:
        stop.set()
        await driver
        await lim.close()
    assert set(outcomes) <= {"ok", during}
    assert errors("admit", outcome) > before_admit
    if fail_open:
        assert errors("settle", "dropped") >= before_settle  # degraded tickets need no settle


async def test_settle_during_outage_is_dropped_and_counted(redis):
    lim = open_limiter(redis.url, key_prefix=f"o:{uuid.uuid4().hex}")
    ticket = await lim.admit(SCOPES, 5)
    before = errors("settle", "dropped")
    redis.stop()
    try:
        await lim.settle(ticket, 1)
    finally:
        redis.start()
    assert errors("settle", "dropped") == before + 1
    await lim.close()


async def test_the_local_policy_admits_each_gateway_its_share_while_redis_is_away(redis, monkeypatch):
    """Issue #50: with Redis down every generation got 503 `limiter_unavailable`. The `local` policy (the gateway's
    default) admits within this gateway's share of each limit (limit / gateways), refuses past it with a 429,
    reports the outage in `degraded`, logs one line (no traceback per call), and hands back to Redis once it answers."""
    events = logged(monkeypatch, outage)
    lim = open_limiter(redis.url, on_outage="local", outage_gateways=4, key_prefix=f"o:{uuid.uuid4().hex}")
    scopes = [LimitScope("key:share", rpm=40, max_concurrency=8)]
    try:
        assert (await lim.admit(scopes, 5)).degraded is False and lim.degraded is None
        before = errors("admit", "local")
        redis.stop()
        try:
            admitted, refused = [], []
            for _ in range(30):
                try:
                    admitted.append(await lim.admit(scopes, 5))
                except LimitExceeded as refusal:
                    refused.append(refusal)
            assert lim.degraded == "local" and backend_up() == 0
            assert len(admitted) == 2  # max_concurrency 8 / 4 gateways: 2 in flight at once
            assert {r.kind for r in refused} == {"concurrency"}
            for ticket in admitted:
                await lim.settle(ticket, 3)  # the slots go back to the local share
            more = 0
            with pytest.raises(LimitExceeded) as past_share:
                while more < 30:
                    await lim.settle(await lim.admit(scopes, 5), 3)
                    more += 1
            assert more == 8 and past_share.value.kind == "rate_limit"  # rpm 40 / 4 gateways: 2 + 8 a minute
            assert errors("admit", "local") - before >= 30
        finally:
            redis.start()
        deadline = asyncio.get_running_loop().time() + 120
        while lim.degraded is not None:  # the next probe (one a second) finds the server back
            assert asyncio.get_running_loop().time() < deadline, "the limiter never went back to Redis"
            with contextlib.suppress(LimitExceeded):
                await lim.settle(await lim.admit(scopes, 5), 3)
            await asyncio.sleep(0.1)
        assert backend_up() == 1
    finally:
        await lim.close()
    names = [event["event"] for event in events]
    assert names.count("limiter_backend_down") == 1 and names.count("limiter_backend_up") == 1
    assert not any("exc_info" in event for event in events)  # no traceback, once or per call
