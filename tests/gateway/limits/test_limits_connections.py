"""The Redis limiter's connections: more calls in flight than connections wait for one instead of failing,
and a wait that outlasts the timeout is an outage (refused when failing closed), never a hang."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid

import pytest
import redis as syncredis

from gateway.limits import LimiterUnavailable, LimitScope, open_limiter
from gateway.limits.redis_limiter import MAX_CONNECTIONS, RedisLimiter
from testkit.servers import redis_server

CROWD = 5 * MAX_CONNECTIONS
SCOPES = [LimitScope("key:crowd", rpm=1_000_000, max_concurrency=CROWD)]


async def admitted(lim: RedisLimiter) -> bool:
    """An admission the server decided (neither refused nor degraded for an outage)."""
    try:
        return not (await lim.admit(SCOPES, 1)).degraded
    except LimiterUnavailable:
        return False


def client_connections(url: str) -> int:
    with syncredis.Redis.from_url(url) as admin:
        return len(admin.client_list(_type="normal")) - 1  # less this one


async def test_a_crowd_larger_than_the_pool_is_admitted_and_settled():
    with redis_server() as server:  # its own: the server's client count is this limiter's alone
        lim = open_limiter(server.url, key_prefix=f"t:{uuid.uuid4().hex}")
        try:
            for _ in range(2):  # the second crowd fits only if the first gave every concurrency slot back
                tickets = await asyncio.gather(*(lim.admit(SCOPES, 5) for _ in range(CROWD)))
                assert not any(t.degraded for t in tickets)
                await asyncio.gather(*(lim.settle(t, 3) for t in tickets))
            assert 0 < client_connections(server.url) <= MAX_CONNECTIONS
        finally:
            await lim.close()


@pytest.mark.parametrize("fail_open", [False, True])
async def test_a_wait_for_a_connection_past_the_timeout_is_an_outage(fail_open):
    with redis_server() as server:
        lim = RedisLimiter(server.url, key_prefix=f"t:{uuid.uuid4().hex}", fail_open=fail_open, timeout=0.5)
        try:
            await lim.settle(await lim.admit(SCOPES, 1), 1)  # scripts loaded, one connection open
            # a stopped server answers nothing until it is continued (a CLIENT PAUSE ends on its own clock,
            # which a loaded machine can outlast before the crowd has timed out)
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                # the first MAX_CONNECTIONS wait on the stopped server, the rest on them; all answer, none hangs
                outcomes = await asyncio.wait_for(
                    asyncio.gather(*(lim.admit(SCOPES, 1) for _ in range(CROWD)), return_exceptions=True), 60)
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            if fail_open:
                assert all(not isinstance(o, BaseException) and o.degraded for o in outcomes)
            else:
                assert all(isinstance(o, LimiterUnavailable) for o in outcomes)
                assert any("no Redis connection free" in str(o.__cause__) for o in outcomes)
            # the server answers again: admitted again at the next probe (one each PROBE_S while it was down)
            deadline = time.monotonic() + 60
            while not await admitted(lim):
                assert time.monotonic() < deadline, "not admitted again after the server came back"
                await asyncio.sleep(0.1)
        finally:
            await lim.close()
