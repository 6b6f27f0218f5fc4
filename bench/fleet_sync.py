"""Fleet syncs per second: the PostgreSQL fleet state against the Redis one, in the same run.

    .venv/bin/python bench/fleet_sync.py [--gateways 10] [--endpoints 100] [--seconds 10] [--baseline TREE]

Throwaway PostgreSQL and redis-server (testkit/servers.py). Each simulated gateway holds its own fleet object
(its own pool or client) and syncs every endpoint back to back, all at once, for `--seconds`: the rate is the
fleet's ceiling. A fleet needs gateways x endpoints / fleet_sync_seconds (0.25 s) syncs per second while every
endpoint is busy (idle followers no longer sync on a timer). `--baseline` runs another checkout's copy of this
script right after, with the same arguments, and prints its table too.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

# this checkout first (testkit/ is found there); and this file's folder off sys.path, where bench/gateway.py would
# shadow the package
sys.path[:] = [str(Path(__file__).resolve().parents[1])] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from gateway.endpoints.fleet import Fleet, RedisFleet, Report  # noqa: E402
from gateway.endpoints.fleet_postgres import PostgresFleet  # noqa: E402
from testkit.databases import create_database  # noqa: E402
from testkit.servers import postgres_server, redis_server  # noqa: E402

SYNC_S, LEASE_S = 0.25, 5.0
REPORT_TTL_S = max(3 * SYNC_S, 2 * LEASE_S)  # as ownership.py sets it


async def syncs_per_second(fleets: list[Fleet], endpoints: int, seconds: float) -> float:
    done = 0
    until = time.monotonic() + seconds

    async def keep_syncing(fleet: Fleet, endpoint: str) -> None:
        nonlocal done
        while time.monotonic() < until:
            await fleet.sync(endpoint, Report(1.0, {"task-1": 1}), REPORT_TTL_S, LEASE_S)
            done += 1

    started = time.monotonic()
    await asyncio.gather(*(keep_syncing(fleet, f"endpoint-{n}") for fleet in fleets for n in range(endpoints)))
    return done / (time.monotonic() - started)


async def run(args: argparse.Namespace) -> None:
    with postgres_server() as postgres, redis_server() as redis:
        database = await create_database(postgres.url, "bench_fleet")
        pg = [await PostgresFleet.open(database, gateway_id=f"gateway-{g}") for g in range(args.gateways)]
        prefix = f"bench-fleet:{uuid.uuid4().hex[:8]}"
        rd = [RedisFleet(redis.url, prefix=prefix, gateway_id=f"gateway-{g}") for g in range(args.gateways)]
        try:
            pg_rate = await syncs_per_second(pg, args.endpoints, args.seconds)
            rd_rate = await syncs_per_second(rd, args.endpoints, args.seconds)
        finally:
            for fleet in pg + rd:
                await fleet.close()
    needed = args.gateways * args.endpoints / SYNC_S
    print(f"{args.gateways} gateways x {args.endpoints} endpoints, {args.seconds:g} s each; "
          f"the fleet needs {needed:,.0f} syncs/s")
    print("| fleet state | syncs/s | vs Redis | vs needed |\n|---|---|---|---|")
    for name, rate in (("PostgreSQL", pg_rate), ("Redis", rd_rate)):
        print(f"| {name} | {rate:,.0f} | {rate / rd_rate:.2f}x | {rate / needed:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gateways", type=int, default=10, choices=range(1, 65), metavar="1..64")
    parser.add_argument("--endpoints", type=int, default=100, choices=range(1, 1001), metavar="1..1000")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout, measured right after")
    args = parser.parse_args()
    if not 0 < args.seconds <= 600:
        parser.error("--seconds must be in (0, 600]")
    print("this tree:", flush=True)
    asyncio.run(run(args))
    if args.baseline is not None:
        print(f"baseline ({args.baseline}):", flush=True)
        subprocess.run([sys.executable, str(args.baseline / "bench" / "fleet_sync.py"), "--gateways",
                        str(args.gateways), "--endpoints", str(args.endpoints), "--seconds", str(args.seconds)],
                       cwd=args.baseline, check=True)


if __name__ == "__main__":
    main()
