"""Redis limiter (many gateways): the same algorithm as the in-process one, run atomically by a Lua script
(one round trip per admission, one per settlement). On an outage it follows the configured policy (outage.py:
a local share of the limits, closed or open), logs the transition once and counts every affected call."""

from __future__ import annotations

import asyncio
import itertools
import os

import structlog
from redis.credentials import CredentialProvider
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.limits import lua
from gateway.limits.clock import Clock, to_us
from gateway.limits.headers import Usage
from gateway.limits.metrics import REJECTIONS
from gateway.limits.model import Ticket
from gateway.limits.outage import Outage, OutagePolicy
from gateway.limits.scope import LimitScope
from gateway.limits.verdict import Failure, refuse_impossible, reject
from gateway.redis_iam import redis_client

log = structlog.get_logger("sluice.limits")

WINDOW_US = 60_000_000
_OUTAGE = (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)
_PER_SCOPE = 7  # values per scope in the admit script's reply
# Redis runs one script at a time, so more connections buy no throughput: calls past this many in flight wait
# for a free connection (up to the timeout) instead of failing. redis-py 8's pool refuses past its own limit
# with MaxConnectionsError, which a fail-closed limiter turned into a 503 for every request past the hundredth
# in flight (hundreds per run of the gateway bench at 128 connections).
MAX_CONNECTIONS = 64


class RedisLimiter:
    def __init__(self, url: str, *, on_outage: OutagePolicy = "closed", outage_gateways: int = 1,
                 fail_open: bool = False, clock: Clock | None = None,
                 concurrency_lease: float = 900.0, concurrency_retry: float = 1.0,
                 key_prefix: str = "sluice:rl", timeout: float = 5.0, credentials: CredentialProvider | None = None):
        # `on_outage`, `outage_gateways`: outage.py; `fail_open=True` is the older spelling of on_outage="open".
        # `credentials`: asked at each new connection (an IAM token, gateway/redis_iam.py); None = the URL's.
        # The timeout is generous: a busy gateway event loop must not look like a Redis outage. One quick
        # reconnect, never a retry after a read timeout (redis_client): a second admit would reserve twice.
        self._redis = redis_client(url, timeout=timeout, credentials=credentials, max_connections=MAX_CONNECTIONS)
        self._connections = asyncio.Semaphore(MAX_CONNECTIONS)
        self._timeout = timeout
        self._admit_script = self._redis.register_script(lua.ADMIT)
        self._settle_script = self._redis.register_script(lua.SETTLE)
        self._clock = clock  # None: the Redis server's TIME is the clock, shared by every replica
        self._lease_us = to_us(concurrency_lease)
        self._conc_retry_us = to_us(concurrency_retry)
        self._prefix = key_prefix
        self.outage = Outage("open" if fail_open else on_outage, gateways=outage_gateways, clock=clock,
                             concurrency_lease=concurrency_lease, concurrency_retry=concurrency_retry)
        self._node = os.urandom(6).hex()  # ticket ids: unique across processes without coordination
        self._seq = itertools.count(1)
        self._keys: dict[str, tuple[str, str, str]] = {}

    @property
    def degraded(self) -> str | None:
        """None while the shared limits hold; during an outage, the policy in force: local, closed or open."""
        return None if self.outage.up else self.outage.policy

    def _scope_keys(self, scope_id: str) -> tuple[str, str, str]:
        keys = self._keys.get(scope_id)
        if keys is None:
            if len(self._keys) > 50_000:
                self._keys.clear()
            p = f"{self._prefix}:{scope_id}"
            keys = self._keys[scope_id] = (f"{p}:log", f"{p}:tok", f"{p}:slots")
        return keys

    def _now_us(self) -> str:
        """The script's clock argument: empty for the Redis server's TIME."""
        return "" if self._clock is None else str(to_us(self._clock()))

    async def admit(self, scopes: list[LimitScope], tokens: int, sequences: int = 1) -> Ticket:
        refuse_impossible(scopes, tokens)
        ticket_id = f"{self._node}{next(self._seq):x}"
        keys: list[str] = []
        args: list[str | int] = [self._now_us(), WINDOW_US, self._lease_us, ticket_id, tokens, sequences]
        for s in scopes:
            keys.extend(self._scope_keys(s.id))
            args.extend((_arg(s.rpm), _arg(s.tpm), _arg(s.max_concurrency)))
        if self.outage.skip_backend():
            return await self.outage.admit(scopes, tokens, sequences, ticket_id, None)
        try:
            reply = await self._run(self._admit_script, keys, args)
        except _OUTAGE as exc:
            self.outage.went_down("admit", repr(exc))
            return await self.outage.admit(scopes, tokens, sequences, ticket_id, exc)
        self.outage.recovered()
        admitted, now = reply[0], reply[1]
        usage: list[Usage] = []
        failures: list[Failure] = []
        for i, s in enumerate(scopes):
            count, tsum, inflight, oldest, rw, tw, cw = reply[2 + _PER_SCOPE * i: 2 + _PER_SCOPE * (i + 1)]
            usage.append((s, count, tsum, oldest if oldest >= 0 else None))
            if not admitted:
                if rw >= 0:
                    failures.append(("rpm", s, rw, count))
                if tw >= 0:
                    failures.append(("tpm", s, tw, tsum))
                if cw >= 0:
                    failures.append(("concurrency", s, None, inflight))
        if not admitted:
            refusal = reject(failures, tokens, now, WINDOW_US, usage, self._conc_retry_us)
            REJECTIONS.labels(refusal.kind).inc()
            raise refusal
        return Ticket(ticket_id, tokens, (now, WINDOW_US, usage), (keys, sequences))

    async def settle(self, ticket: Ticket, used_tokens: int) -> None:
        if self.outage.owns(ticket):  # admitted by the local share during an outage
            await self.outage.settle(ticket, used_tokens)
            return
        if ticket.settled or ticket.degraded:
            return
        if used_tokens < 0:
            raise ValueError("used_tokens must be >= 0")
        ticket.settled = True
        keys, sequences = ticket._hold
        try:
            await self._run(self._settle_script, keys, [ticket.id, used_tokens - ticket.tokens, sequences])
        except _OUTAGE as exc:
            # The slot's lease and the window's expiry bound the damage: nothing to hand to the caller.
            self.outage.dropped_settle()
            self.outage.went_down("settle", repr(exc))
            return
        self.outage.recovered()

    async def _run(self, script, keys: list[str], args: list) -> list:
        """The script on a connection of the pool, once one is free; none free within the timeout is an outage."""
        if self._connections.locked():
            try:
                async with asyncio.timeout(self._timeout):
                    await self._connections.acquire()
            except TimeoutError:
                raise RedisTimeoutError(f"no Redis connection free within {self._timeout:g} s") from None
        else:
            await self._connections.acquire()  # free: returns at once, without a timer per call
        try:
            return await script(keys=keys, args=args)
        finally:
            self._connections.release()

    async def close(self) -> None:
        await self._redis.aclose()
        await self.outage.close()


def _arg(limit: int | None) -> int:
    return -1 if limit is None else limit
