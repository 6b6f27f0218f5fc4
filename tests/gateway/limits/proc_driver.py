"""One 'gateway' process for the cross-process proof: its own Redis limiter, concurrent admissions.

Usage: python proc_driver.py REDIS_URL PREFIX SCENARIO PROCESSES. Waits on a Redis barrier until every
process is ready, runs the scenario, prints one JSON line with what it saw.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys

import redis.asyncio as aioredis

from gateway.limits import LimitExceeded, LimitScope, open_limiter


async def barrier(r: aioredis.Redis, prefix: str, parties: int) -> None:
    await r.incr(f"{prefix}:barrier")
    while int(await r.get(f"{prefix}:barrier")) < parties:
        await asyncio.sleep(0.001)


async def rpm(lim, r, prefix) -> dict:
    scopes = [LimitScope("key:proof", rpm=50), LimitScope("team:proof", rpm=10_000)]

    async def one():
        try:
            await lim.admit(scopes, 10)
            return None
        except LimitExceeded as err:
            return (err.kind, err.retry_after)

    results = await asyncio.gather(*(one() for _ in range(100)))
    refused = [x for x in results if x is not None]
    return {"admitted": len(results) - len(refused), "refused": refused}


async def concurrency(lim, r, prefix) -> dict:
    scopes = [LimitScope("key:proof", max_concurrency=3)]
    seen, admitted, refused = [], 0, 0
    rng = random.Random()

    async def worker():
        nonlocal admitted, refused
        for _ in range(15):
            try:
                ticket = await lim.admit(scopes, 1)
            except LimitExceeded:
                refused += 1
                await asyncio.sleep(0.001)
                continue
            admitted += 1
            try:  # an observer counter inside the slot: it can only undercount the slots held
                seen.append(await r.incr(f"{prefix}:inflight"))
                await asyncio.sleep(rng.uniform(0.001, 0.004))
                await r.decr(f"{prefix}:inflight")
            finally:
                await lim.settle(ticket, 1)

    await asyncio.gather(*(worker() for _ in range(20)))
    return {"max_inflight": max(seen, default=0), "admitted": admitted, "refused": refused}


async def tpm(lim, r, prefix) -> dict:
    scopes = [LimitScope("key:proof", tpm=3000)]
    rng = random.Random()
    charged = 0

    async def worker():
        nonlocal charged
        for _ in range(4):
            reserve = rng.randint(20, 150)
            try:
                ticket = await lim.admit(scopes, reserve)
            except LimitExceeded:
                return
            await asyncio.sleep(rng.uniform(0, 0.003))
            used = reserve // 2
            await lim.settle(ticket, used)
            charged += used

    await asyncio.gather(*(worker() for _ in range(60)))
    return {"charged": charged}


async def main(url: str, prefix: str, scenario: str, parties: int) -> None:
    lim = open_limiter(url, key_prefix=prefix)  # no clock: the server's TIME, as in production
    r = aioredis.Redis.from_url(url)
    try:
        await barrier(r, prefix, parties)
        result = await {"rpm": rpm, "concurrency": concurrency, "tpm": tpm}[scenario](lim, r, prefix)
    finally:
        await lim.close()
        await r.aclose()
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
