"""Admission cost of the rate limiter, in-process and Redis, against no-limit baselines in the same run.

    .venv/bin/python bench/limits.py [--redis-url redis://…] [-n 50000]

Without --redis-url a throwaway redis-server is started (testkit/servers.py). Each row is the mean cost of one
admit and of one settle, sequentially awaited; the Redis rows are compared with a bare PING (one round trip).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import time
import uuid
from pathlib import Path

import redis.asyncio as aioredis

# this checkout first (testkit/ is found there); and this file's folder off sys.path, where bench/gateway.py would
# shadow the package
sys.path[:] = [str(Path(__file__).resolve().parents[1])] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from gateway.limits import LimitScope, Ticket, open_limiter  # noqa: E402

FULL = [LimitScope("key:bench", rpm=10**9, tpm=10**12, max_concurrency=10**6),
        LimitScope("team:bench", rpm=10**9, tpm=10**12, max_concurrency=10**6)]
UNLIMITED = [LimitScope("key:bench"), LimitScope("team:bench")]


class NoLimiter:
    """The no-limit baseline: what the gateway would pay to call a limiter that does nothing."""

    async def admit(self, scopes, tokens):
        return Ticket("0", tokens)

    async def settle(self, ticket, used_tokens):
        return None

    async def close(self):
        return None


async def measure(lim, scopes, n: int) -> tuple[float, float]:
    """Mean µs per admit and per settle (headers built too, as the gateway will)."""
    for _ in range(min(n, 1000)):  # warm up: script cache, connection pool, allocator
        await lim.settle(await lim.admit(scopes, 100), 60)
    admit_s = settle_s = 0.0
    clock = time.perf_counter
    for _ in range(n):
        t0 = clock()
        ticket = await lim.admit(scopes, 100)
        ticket.headers()
        t1 = clock()
        await lim.settle(ticket, 60)
        settle_s += clock() - t1
        admit_s += t1 - t0
    return admit_s / n * 1e6, settle_s / n * 1e6


async def ping_us(url: str, n: int) -> float:
    r = aioredis.Redis.from_url(url)
    for _ in range(200):
        await r.ping()
    t0 = time.perf_counter()
    for _ in range(n):
        await r.ping()
    elapsed = time.perf_counter() - t0
    await r.aclose()
    return elapsed / n * 1e6


async def concurrent_rate(lim, scopes, tasks: int, per_task: int) -> float:
    async def worker():
        for _ in range(per_task):
            await lim.settle(await lim.admit(scopes, 100), 60)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return tasks * per_task / (time.perf_counter() - t0)


async def main(url: str | None, n: int) -> None:
    rows: list[tuple[str, float, float]] = []
    base = await measure(NoLimiter(), FULL, n)
    rows.append(("no limiter (baseline)", *base))
    mem_unl = open_limiter(None)
    rows.append(("in-process, no limits set", *await measure(mem_unl, UNLIMITED, n)))
    mem = open_limiter(None)
    mem_full = await measure(mem, FULL, n)
    rows.append(("in-process, 2 scopes x 4 limits", *mem_full))
    redis_rows: dict[str, float] = {}
    if url is not None:
        rn = max(1000, n // 10)
        redis_rows["ping"] = await ping_us(url, rn)
        lim = open_limiter(url, key_prefix=f"bench:{uuid.uuid4().hex}")
        red = await measure(lim, FULL, rn)
        rows.append(("redis, 2 scopes x 4 limits", *red))
        redis_rows["admit"], redis_rows["settle"] = red
        redis_rows["conc"] = await concurrent_rate(lim, FULL, 32, max(50, rn // 32))
        await lim.close()
    print(f"{'limiter':<34}{'admit µs':>10}{'settle µs':>11}")
    for name, a, s in rows:
        print(f"{name:<34}{a:>10.2f}{s:>11.2f}")
    print()
    print(f"in-process admit / no-limiter admit: {mem_full[0] / base[0]:.1f}x "
          f"(+{mem_full[0] - base[0]:.2f} µs per request; target < 20 µs)")
    if redis_rows:
        print(f"redis PING round trip:               {redis_rows['ping']:.1f} µs")
        print(f"redis admit / PING:                  {redis_rows['admit'] / redis_rows['ping']:.2f}x (one round trip)")
        print(f"redis settle / PING:                 {redis_rows['settle'] / redis_rows['ping']:.2f}x (one round trip)")
        print(f"redis admit / in-process admit:      {redis_rows['admit'] / mem_full[0]:.1f}x")
        print(f"redis, 32 concurrent tasks:          {redis_rows['conc']:.0f} admit+settle pairs/s")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url")
    parser.add_argument("-n", type=int, default=50_000)
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        url = args.redis_url
        if url is None and shutil.which("redis-server"):
            from testkit.servers import redis_server

            url = stack.enter_context(redis_server()).url
        if url is None:
            print("redis-server not found: Redis rows skipped")
        asyncio.run(main(url, args.n))


if __name__ == "__main__":
    cli()
