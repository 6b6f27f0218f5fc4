"""Budgets shared by a fleet of gateways: the counters of gateway/limits/budgets.py in Redis, one HASH per budget
and period (`charged`, `settled`), reserved and settled by Lua scripts (one round trip each), so however many
gateways admit at once, no reservation passes a limit. A counter Redis does not hold (never used, or lost with an
unpersisted server) is seeded from the ledger by the first gateway that needs it (set only if still absent)."""

from __future__ import annotations

import time

import structlog
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.limits.budget_model import BudgetLine, BudgetSpent, Hold, Seeder, Seeding, Settled, never_fits
from gateway.limits.metrics import BACKEND_ERRORS
from gateway.limits.model import LimiterUnavailable
from gateway.redis_iam import redis_client

log = structlog.get_logger("sluice.limits")
_OUTAGE = (RedisConnectionError, RedisTimeoutError, OSError, TimeoutError)
GRACE_S = 7 * 86400  # a counter outlives its period by a week: late settlements of long requests land first

# KEYS: the counters; ARGV: per counter its amount and its limit (-1: none). Replies {1} (reserved), {2, i...}
# (counters i are absent: seed them first) or {0, i, charged, settled} (counter i has no room).
RESERVE = r"""
local missing = {}
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then missing[#missing + 1] = i end
end
if #missing > 0 then return {2, unpack(missing)} end
for i = 1, #KEYS do
  local amount, limit = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
  local charged = tonumber(redis.call('HGET', KEYS[i], 'charged') or '0')
  if limit >= 0 and charged + amount > limit then
    return {0, i, charged, tonumber(redis.call('HGET', KEYS[i], 'settled') or '0')}
  end
end
for i = 1, #KEYS do redis.call('HINCRBY', KEYS[i], 'charged', tonumber(ARGV[2 * i - 1])) end
return {1}
"""

# KEYS[1]: the counter; ARGV: the ledger's sum, the TTL in ms. Sets it only when no gateway did first.
SEED = r"""
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'charged', ARGV[1], 'settled', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
"""

# KEYS: the counters; ARGV: per counter its reservation and its real amount. Replies per counter settled before
# and after (-1, -1: the counter is gone).
SETTLE = r"""
local out = {}
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local reserved, used = tonumber(ARGV[2 * i - 1]), tonumber(ARGV[2 * i])
    if redis.call('HINCRBY', KEYS[i], 'charged', used - reserved) < 0 then redis.call('HSET', KEYS[i], 'charged', 0) end
    local after = redis.call('HINCRBY', KEYS[i], 'settled', used)
    out[#out + 1] = after - used
    out[#out + 1] = after
  else
    out[#out + 1] = -1
    out[#out + 1] = -1
  end
end
return out
"""


class RedisBook:
    def __init__(self, url: str, seeder: Seeder, *, fail_open: bool = False, credentials=None,
                 key_prefix: str = "sluice:budget", timeout: float = 5.0) -> None:
        self._redis = redis_client(url, timeout=timeout, credentials=credentials, max_connections=64)
        self._reserve = self._redis.register_script(RESERVE)
        self._seed = self._redis.register_script(SEED)
        self._settle = self._redis.register_script(SETTLE)
        self._seeding = Seeding(seeder)
        self._prefix = key_prefix
        self.fail_open = fail_open

    def _key(self, line: BudgetLine) -> str:
        return f"{self._prefix}:{line.id}"

    async def reserve(self, lines: list[BudgetLine], amounts: list[int]) -> Hold:
        never_fits(lines, amounts)
        keys = [self._key(line) for line in lines]
        args = [v for amount, line in zip(amounts, lines) for v in (amount, -1 if line.limit is None else line.limit)]
        for _ in range(3):  # seeded counters can expire between two calls only at a period's end
            reply = await self._run("budget", self._reserve, keys, args)
            if reply is None:  # Redis is down and the book fails open
                return Hold(lines, amounts, degraded=True)
            if reply[0] != 2:
                break
            for index in (int(i) - 1 for i in reply[1:]):
                seed = await self._seeding.seed(lines[index])  # a ledger that cannot be read raises its own error
                ttl_ms = int(max(lines[index].end - time.time(), 0) + GRACE_S) * 1000
                if await self._run("budget", self._seed, [keys[index]], [seed, ttl_ms]) is None:
                    return Hold(lines, amounts, degraded=True)
        if reply[0] == 0:
            _, index, charged, settled = (int(v) for v in reply)
            raise BudgetSpent(lines[index - 1], settled, charged - settled, amounts[index - 1])
        if reply[0] != 1:
            raise LimiterUnavailable("budget counters kept disappearing while being seeded")
        return Hold(lines, amounts)

    async def settle(self, hold: Hold, actual: list[int]) -> Settled:
        if hold.settled or hold.degraded:
            return []
        hold.settled = True
        keys = [self._key(line) for line in hold.lines]
        args = [v for reserved, used in zip(hold.amounts, actual) for v in (reserved, used)]
        reply = await self._run("budget_settle", self._settle, keys, args, dropped=True)
        if reply is None:
            return []
        return [(line, int(reply[2 * i]), int(reply[2 * i + 1])) for i, line in enumerate(hold.lines)
                if int(reply[2 * i]) >= 0]

    async def _run(self, op: str, script, keys: list[str], args: list, *, dropped: bool = False) -> list | None:
        """The script's reply; None when Redis is down and the call is dropped (a settlement) or fails open; else
        LimiterUnavailable (fail closed: 503)."""
        try:
            return await script(keys=keys, args=args)
        except _OUTAGE as exc:
            outcome = "dropped" if dropped else "fail_open" if self.fail_open else "fail_closed"
            BACKEND_ERRORS.labels(op, outcome).inc()
            log.warning("budget_backend_down", op=op, error=repr(exc), fail_open=self.fail_open)
            if outcome == "fail_closed":
                raise LimiterUnavailable(f"budget backend unavailable: {exc.__class__.__name__}") from exc
            return None

    async def close(self) -> None:
        await self._redis.aclose()

