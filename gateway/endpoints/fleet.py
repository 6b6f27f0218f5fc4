"""What the gateways of a fleet share about each endpoint, and the one interface to it.

Several gateways serve the same ECS worker services. For each endpoint they share:
- every gateway's **report**: its demand (in flight + waiting) and its requests in flight per replica, with
  the draining replicas it has seen; a report expires `report_ttl_s` after it was written, so a dead
  gateway's demand disappears by itself;
- the **lease** on the endpoint's scaling: one gateway at a time holds it, with a fencing token that grows
  with every new holder; only the holder of the newest token may write the ECS service (`fence`);
- the **replica list** the owner discovered (ECS tasks, with addresses), which the others read instead of
  asking ECS themselves;
- the **draining** replicas: marked by the owner, skipped by every gateway's router;
- the **ECS API budget**: calls per second for the whole fleet (`take_call`);
- the endpoint's **failure** (`mark_failed`): a crash loop the owner saw holds on every gateway and across
  a lease move until a PATCH, a DELETE or a new create clears it.

And for the fleet as a whole:
- the **config version** (`bump_config`): every admin change of an endpoint (kept in the gateways' shared database,
  store.py) increments it and tells every gateway (`changes`), which reloads (config_follower.py); a gateway that
  missed the message sees the new number at its next periodic look;
- each gateway's **liveness** (`watch`, and every `sync`): a report counts while its gateway is alive, so an idle
  gateway keeps all its reports alive with one write, whatever the number of endpoints;
- the **state version**: each change of an endpoint's shared state (replica list, draining marks, failure, a lease
  given up) increments it, records it per endpoint and names the endpoint on the state channel, so that idle
  gateways read an endpoint only when it changed (`changes`; `state_versions` when a message may have been lost);
  a gateway whose demand appears names the endpoint on the wake channel (`wake`): its owner looks at once.

`RedisFleet` keeps it in Redis (`redis_url`); `LocalFleet` in this process (the embedded single gateway,
and every `local` or `static` endpoint, whose replicas belong to one gateway): the lone gateway always
holds the lease. gateway/endpoints/README.md ("A fleet of gateways") says how they are used.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec
from redis.asyncio.client import Pipeline, PubSub
from redis.credentials import CredentialProvider

from gateway.redis_iam import redis_client


class Report(msgspec.Struct, frozen=True):
    """One gateway's view of one endpoint."""

    demand: float  # requests in flight on the endpoint's replicas + waiting for one
    in_flight: dict[str, int] = {}  # replica id -> this gateway's requests on it (zeros left out)
    draining_seen: list[str] = []  # the draining marks this gateway has applied to its router


FAILURE_DETAIL_CHARS = 2000  # a worker's last line, kept whole enough to read and bounded in the shared state


class Failure(msgspec.Struct, frozen=True):
    """Why an endpoint failed: `reason` a fixed phrase a tenant may see, `detail` the operator's."""

    reason: str
    detail: str

    def bounded(self) -> Failure:
        return Failure(self.reason[:200], self.detail[:FAILURE_DETAIL_CHARS])


class Replicas(msgspec.Struct, frozen=True):
    """The owner's last look at the provisioner: (replica id, URL or None while it has no address)."""

    token: int
    replicas: list[tuple[str, str | None]]
    desired: int


class Synced(NamedTuple):
    token: int | None  # this gateway's fencing token, or None when another gateway holds the lease (or none can)
    reports: dict[str, Report]  # every live gateway's report, this one's included
    holder: str | None  # the gateway holding the lease after this sync (None: nobody)


class Watch(NamedTuple):
    state_version: int  # the fleet's state version: it moved if any endpoint's shared state changed
    alive: set[str]  # the gateways alive now


class Changes(NamedTuple):
    config: bool = False  # the config version moved (or the listener was (re)connected: look at every version)
    endpoints: frozenset[str] = frozenset()  # endpoints whose shared state changed
    wake: frozenset[str] = frozenset()  # endpoints whose demand appeared on some gateway (for their owner)
    relisten: bool = False  # the listener was (re)connected: messages may have been lost before


@dataclass
class CallBudget:
    """At most `per_second` calls in each wall-clock second (a fixed window; the shared one lives in Redis)."""

    per_second: float
    _window: int = -1
    _used: int = field(default=0)

    def take(self, now: float, calls: int = 1) -> float:
        """0 when `calls` calls may go now (and counts them), else the seconds until the next window."""
        second = math.floor(now)
        if second != self._window:
            self._window, self._used = second, 0
        if self._used + calls <= self.per_second:
            self._used += calls
            return 0.0
        return second + 1 - now


class Fleet(ABC):
    """Shared state for one gateway; every method names the endpoint it is about."""

    def __init__(self, gateway_id: str | None = None):
        self.gateway_id = gateway_id or f"{os.uname().nodename}-{os.getpid()}-{os.urandom(3).hex()}"

    @abstractmethod
    async def sync(self, endpoint: str, report: Report, ttl_s: float, lease_s: float) -> Synced:
        """Publish this gateway's report (it counts while this gateway is alive: for `ttl_s` from now, or longer
        with `watch`), take or renew the lease."""

    @abstractmethod
    async def renew(self, leases: dict[str, int], lease_s: float) -> set[str]:
        """Renew for `lease_s` each lease (endpoint -> token) this gateway still holds with that token, in one round
        trip (Redis: per RENEW_KEYS leases) whatever their number (the idle owners' renewal, lease_renewal.py); the
        endpoints renewed. A lease that lapsed, or that another gateway took, is left alone: its endpoint syncs to
        learn that it lost it."""

    @abstractmethod
    async def watch(self, ttl_s: float) -> Watch:
        """This gateway is alive for `ttl_s` more; the fleet's state version and the gateways alive. A constant
        number of commands, whatever the number of endpoints: an idle gateway's whole periodic cost."""

    @abstractmethod
    async def state_versions(self) -> dict[str, int]:
        """Every endpoint's state version (read when the fleet's moved without a message saying which)."""

    @abstractmethod
    async def wake(self, endpoint: str) -> None:
        """Demand appeared here for `endpoint`: tell its owner (which looks at every report at once)."""

    @abstractmethod
    async def fence(self, endpoint: str, token: int) -> bool:
        """True while `token` still holds the lease and no newer token wrote: the check before every write."""

    @abstractmethod
    async def resign(self, endpoint: str) -> None:
        """Give up the lease (if held) and withdraw this gateway's report: a stopping gateway."""

    @abstractmethod
    async def share(self, endpoint: str, replicas: Replicas) -> None: ...

    @abstractmethod
    async def shared(self, endpoint: str) -> Replicas | None: ...

    @abstractmethod
    async def mark_draining(self, endpoint: str, replica_id: str) -> None: ...

    @abstractmethod
    async def draining(self, endpoint: str) -> set[str]: ...

    @abstractmethod
    async def forget_draining(self, endpoint: str, replica_ids: set[str]) -> None:
        """Drop the marks of replicas that no longer exist."""

    @abstractmethod
    async def take_call(self, scope: str, calls: int = 1) -> float:
        """0 when `calls` API calls against `scope` (an AWS region's ECS) may go now, else seconds to wait.
        `calls` above the budget per second never go: ask for them in turns."""

    @abstractmethod
    async def mark_failed(self, endpoint: str, failure: Failure) -> None: ...

    @abstractmethod
    async def failure(self, endpoint: str) -> Failure | None: ...

    @abstractmethod
    async def clear_failed(self, endpoint: str) -> None: ...

    @abstractmethod
    async def config_version(self) -> int:
        """The number of admin changes to endpoints so far (0 before the first)."""

    @abstractmethod
    async def bump_config(self) -> int:
        """After an admin change was stored: count it and tell every gateway; the new version."""

    @abstractmethod
    async def changes(self, timeout: float) -> Changes:
        """What the fleet's messages said (a hint: read the versions) once one came, or nothing after `timeout`;
        at once, `relisten`, after (re)connecting the listener, since a change just before sent it nothing."""

    async def close(self) -> None:  # noqa: B027 (an optional hook: most fleets hold nothing to close)
        pass


class LocalFleet(Fleet):
    """One gateway alone: it owns every endpoint; the state is this process's."""

    def __init__(self, calls_per_second: float = 2.0):
        super().__init__("local")
        self._replicas: dict[str, Replicas] = {}
        self._draining: dict[str, set[str]] = {}
        self._budgets: dict[str, CallBudget] = {}
        self._calls_per_second = calls_per_second
        self._failures: dict[str, Failure] = {}
        self._version = 0
        self._bumped = asyncio.Event()

    async def sync(self, endpoint, report, ttl_s, lease_s):
        return Synced(1, {self.gateway_id: report}, self.gateway_id)

    async def renew(self, leases, lease_s):
        return set(leases)

    async def watch(self, ttl_s):
        return Watch(0, {self.gateway_id})

    async def state_versions(self):
        return {}

    async def wake(self, endpoint):
        pass

    async def fence(self, endpoint, token):
        return True

    async def resign(self, endpoint):
        pass

    async def share(self, endpoint, replicas):
        self._replicas[endpoint] = replicas

    async def shared(self, endpoint):
        return self._replicas.get(endpoint)

    async def mark_draining(self, endpoint, replica_id):
        self._draining.setdefault(endpoint, set()).add(replica_id)

    async def draining(self, endpoint):
        return set(self._draining.get(endpoint, ()))

    async def forget_draining(self, endpoint, replica_ids):
        self._draining.get(endpoint, set()).difference_update(replica_ids)

    async def take_call(self, scope, calls=1):
        budget = self._budgets.setdefault(scope, CallBudget(self._calls_per_second))
        return budget.take(time.time(), calls)

    async def mark_failed(self, endpoint, failure):
        self._failures[endpoint] = failure.bounded()

    async def failure(self, endpoint):
        return self._failures.get(endpoint)

    async def clear_failed(self, endpoint):
        self._failures.pop(endpoint, None)

    async def config_version(self):
        return self._version

    async def bump_config(self):
        self._version += 1
        self._bumped.set()
        return self._version

    async def changes(self, timeout):
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._bumped.wait()
        bumped = self._bumped.is_set()
        self._bumped.clear()
        return Changes(config=bumped)


# KEYS: owner, token counter, fence; ARGV: gateway id, lease ms. Renew our lease, or take a free one with a new
# token. Returns {our token, us}, or {0, the holder} when another gateway holds it.
_CLAIM = """
local held = redis.call('GET', KEYS[1])
if held then
  local holder, token = string.match(held, '^(.*)|(%d+)$')
  if holder == ARGV[1] then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    return {tonumber(token), holder}
  end
  return {0, holder}
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. token, 'PX', ARGV[2])
return {token, ARGV[1]}
"""
# KEYS: owners; ARGV: lease ms, then for each owner the value it holds while ours ("<gateway>|<token>"). Renew each
# lease that still holds our token (fenced per key, as _CLAIM renews); 1 or 0 for each.
_RENEW = """
local renewed = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
    renewed[i] = 1
  else
    renewed[i] = 0
  end
end
return renewed
"""
RENEW_KEYS = 512  # owners per script (one round trip each): bounds how long one script holds the server
# KEYS: the gateways' liveness (a sorted set: gateway -> until, ms of the server's clock); ARGV: gateway id, ttl ms.
# This gateway is alive ttl ms more; those dead for an hour are dropped. Returns the gateways alive.
_ALIVE = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[1], ms + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - 3600000)
return redis.call('ZRANGEBYSCORE', KEYS[1], ms, '+inf')
"""
# KEYS: owner, fence; ARGV: gateway id, token. The token may write while it holds the lease and no newer
# token has written; the fence remembers the newest token that wrote.
_FENCE = """
local held = redis.call('GET', KEYS[1])
if held ~= ARGV[1] .. '|' .. ARGV[2] then return 0 end
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[2]) < last then return 0 end
redis.call('SET', KEYS[2], ARGV[2])
return 1
"""
# KEYS: owner; ARGV: gateway id. Delete the lease only if it is ours.
_RESIGN = """
local held = redis.call('GET', KEYS[1])
if held and string.match(held, '^(.*)|%d+$') == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
"""
# KEYS: the window's counter; ARGV: limit, calls. Count the calls if the window has room for all of them.
_TAKE_CALL = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used + tonumber(ARGV[2]) > tonumber(ARGV[1]) then return 0 end
redis.call('INCRBY', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], 2000)
return 1
"""
# KEYS: the fleet's state version, the versions per endpoint; ARGV: endpoint, the state channel.
_BUMP_STATE = """
local version = redis.call('INCR', KEYS[1])
redis.call('HSET', KEYS[2], ARGV[1], version)
redis.call('PUBLISH', ARGV[2], ARGV[1])
return version
"""
_report = msgspec.json.Decoder(Report)
_replicas = msgspec.json.Decoder(Replicas)
_failure = msgspec.json.Decoder(Failure)


MAX_CONNECTIONS = 4096
REPORT_KEEP_MS = 86_400_000  # a report counts while its gateway is alive; this only bounds a forgotten one


class RedisFleet(Fleet):
    def __init__(self, url: str, *, calls_per_second: float = 2.0, prefix: str = "sluice:fleet",
                 timeout: float = 5.0, gateway_id: str | None = None, credentials: CredentialProvider | None = None):
        """`credentials`: asked at each new connection (an IAM token, gateway/redis_iam.py); None = the URL's."""
        super().__init__(gateway_id)
        # One quick reconnect (redis_client), rather than a failed tick. Every call here may run twice: the scripts
        # renew the same lease and token, a budget counts its calls twice at most.
        # redis-py's pool refuses a 101st connection by default; every endpoint's loop may hold one at once (a start
        # syncs them all together), so the cap is well above any endpoint count a gateway serves
        self._redis = redis_client(url, timeout=timeout, credentials=credentials, max_connections=MAX_CONNECTIONS)
        self._prefix = prefix
        self._calls_per_second = calls_per_second
        self._claim = self._redis.register_script(_CLAIM)
        self._fence = self._redis.register_script(_FENCE)
        self._resign = self._redis.register_script(_RESIGN)
        self._take_call = self._redis.register_script(_TAKE_CALL)
        self._alive = self._redis.register_script(_ALIVE)
        self._renew = self._redis.register_script(_RENEW)
        self._bump_state = self._redis.register_script(_BUMP_STATE)
        self._pubsub: PubSub | None = None  # opened by the first `changes`
        self._alive_until = -math.inf  # monotonic: this gateway's liveness lasts until then at least
        self._living: set[str] = set()  # the gateways alive at the last look...
        self._living_at = -math.inf  # ...which began then (monotonic)
        self._channels = {f"{prefix}:{name}": name for name in ("config", "state", "wake")}

    def _key(self, endpoint: str, what: str) -> str:
        return f"{self._prefix}:{{{endpoint}}}:{what}"

    async def _live(self, ttl_s: float) -> set[str]:
        """This gateway is alive `ttl_s` more; the gateways alive now (kept: a sync reads them only when a member is
        not among them)."""
        started = time.monotonic()
        alive = await self._alive(keys=[f"{self._prefix}:alive"], args=[self.gateway_id, int(ttl_s * 1000)])
        self._alive_until, self._living_at, self._living = started + ttl_s, started, {g.decode() for g in alive}
        return self._living

    async def sync(self, endpoint, report, ttl_s, lease_s):
        members = self._key(endpoint, "gateways")
        if time.monotonic() + ttl_s / 2 > self._alive_until:  # alive before a member (unless surely alive already)
            await self._live(ttl_s)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self._key(endpoint, f"report:{self.gateway_id}"), msgspec.json.encode(report), px=REPORT_KEEP_MS)
            pipe.sadd(members, self.gateway_id)
            pipe.smembers(members)
            *_, gateways = await pipe.execute()
        names = sorted(g.decode() for g in gateways)
        # the gateways alive as of this gateway's last look (at most half a lifetime ago: a dead gateway's report
        # counts that much longer); a member not among them joined since, or died: ask now, after reading the members
        alive = self._living
        if time.monotonic() - self._living_at > ttl_s / 2 or any(name not in alive for name in names):
            alive = await self._live(ttl_s)
        token, holder = await self._claim(keys=[self._key(endpoint, "owner"), self._key(endpoint, "token"),
                                                self._key(endpoint, "fence")],
                                          args=[self.gateway_id, int(lease_s * 1000)])
        live = [name for name in names if name in alive]
        bodies = await self._redis.mget([self._key(endpoint, f"report:{name}") for name in live]) if live else []
        reports = {name: _report.decode(body) for name, body in zip(live, bodies) if body is not None}
        gone = [name for name in names if name not in reports]  # dead (or its report withdrawn): its streams too
        if gone:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.srem(members, *gone)
                pipe.delete(*(self._key(endpoint, f"report:{name}") for name in gone))
                await pipe.execute()
        return Synced(int(token) or None, reports, holder.decode() if holder else None)

    async def renew(self, leases, lease_s):
        endpoints, renewed = list(leases), set()
        for start in range(0, len(endpoints), RENEW_KEYS):  # (not a pipeline: it asks SCRIPT EXISTS first)
            chunk = endpoints[start:start + RENEW_KEYS]
            flags = await self._renew(keys=[self._key(endpoint, "owner") for endpoint in chunk],
                                      args=[int(lease_s * 1000), *(f"{self.gateway_id}|{leases[e]}" for e in chunk)])
            renewed.update(endpoint for endpoint, flag in zip(chunk, flags) if flag)
        return renewed

    async def watch(self, ttl_s):
        alive = await self._live(ttl_s)
        return Watch(int(await self._redis.get(f"{self._prefix}:{{state}}:version") or 0), alive)

    async def state_versions(self):
        versions = await self._redis.hgetall(f"{self._prefix}:{{state}}:versions")
        return {endpoint.decode(): int(version) for endpoint, version in versions.items()}

    async def _changed(self, endpoint: str, pipe: Pipeline) -> None:
        """Queue on `pipe`, after the change itself: count it, record it, name the endpoint on the state channel."""
        await self._bump_state(keys=[f"{self._prefix}:{{state}}:version", f"{self._prefix}:{{state}}:versions"],
                               args=[endpoint, f"{self._prefix}:state"], client=pipe)

    async def wake(self, endpoint):
        await self._redis.publish(f"{self._prefix}:wake", endpoint)

    async def fence(self, endpoint, token):
        return bool(await self._fence(keys=[self._key(endpoint, "owner"), self._key(endpoint, "fence")],
                                      args=[self.gateway_id, token]))

    async def resign(self, endpoint):
        await self._resign(keys=[self._key(endpoint, "owner")], args=[self.gateway_id])
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(self._key(endpoint, f"report:{self.gateway_id}"))
            pipe.srem(self._key(endpoint, "gateways"), self.gateway_id)
            await self._changed(endpoint, pipe)  # the others take the lease at once
            await pipe.execute()

    async def share(self, endpoint, replicas):
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self._key(endpoint, "replicas"), msgspec.json.encode(replicas))
            await self._changed(endpoint, pipe)
            await pipe.execute()

    async def shared(self, endpoint):
        body = await self._redis.get(self._key(endpoint, "replicas"))
        return None if body is None else _replicas.decode(body)

    async def mark_draining(self, endpoint, replica_id):
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.sadd(self._key(endpoint, "draining"), replica_id)
            await self._changed(endpoint, pipe)
            await pipe.execute()

    async def draining(self, endpoint):
        return {m.decode() for m in await self._redis.smembers(self._key(endpoint, "draining"))}

    async def forget_draining(self, endpoint, replica_ids):
        if replica_ids:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.srem(self._key(endpoint, "draining"), *replica_ids)
                await self._changed(endpoint, pipe)
                await pipe.execute()

    async def take_call(self, scope, calls=1):
        now = time.time()
        second = math.floor(now)
        if await self._take_call(keys=[f"{self._prefix}:calls:{scope}:{second}"],
                                 args=[self._calls_per_second, calls]):
            return 0.0
        return second + 1 - now

    async def mark_failed(self, endpoint, failure):
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.set(self._key(endpoint, "failed"), msgspec.json.encode(failure.bounded()))
            await self._changed(endpoint, pipe)
            await pipe.execute()

    async def failure(self, endpoint):
        body = await self._redis.get(self._key(endpoint, "failed"))
        return None if body is None else _failure.decode(body)

    async def clear_failed(self, endpoint):
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(self._key(endpoint, "failed"))
            await self._changed(endpoint, pipe)
            await pipe.execute()

    async def config_version(self):
        return int(await self._redis.get(f"{self._prefix}:config:version") or 0)

    async def bump_config(self):
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.incr(f"{self._prefix}:config:version")
            pipe.publish(f"{self._prefix}:config", b"")
            version, _ = await pipe.execute()
        return int(version)

    async def changes(self, timeout):
        try:
            if self._pubsub is None:
                self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
                await self._pubsub.subscribe(*self._channels)
                return Changes(config=True, relisten=True)  # a change before the subscription sent nothing here
            deadline = time.monotonic() + timeout
            messages = []
            while not messages and time.monotonic() < deadline:  # (a subscription's own reply reads as None)
                message = await self._pubsub.get_message(timeout=max(0.0, deadline - time.monotonic()))
                while message is not None:  # and whatever else came meanwhile
                    messages.append(message)
                    message = await self._pubsub.get_message(timeout=0)
        except BaseException:
            await self._close_pubsub()  # a lost connection: subscribe afresh at the next call
            raise
        said: dict[str, set[str]] = {"config": set(), "state": set(), "wake": set()}
        for message in messages:
            if message.get("type") == "message":
                said[self._channels.get(message["channel"].decode(), "config")].add(message["data"].decode())
        return Changes(bool(said["config"]), frozenset(said["state"]), frozenset(said["wake"]))

    async def _close_pubsub(self) -> None:
        pubsub, self._pubsub = self._pubsub, None
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def close(self):
        await self._close_pubsub()
        await self._redis.aclose()
