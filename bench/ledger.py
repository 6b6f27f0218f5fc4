"""Usage ledger benchmark: simulated requests per second with the ledger on vs off, in one run.

    .venv/bin/python bench/ledger.py [--requests N] [--concurrency C] [--database-url URL]

"off" runs the same simulated request handlers without recording; "on" awaits Ledger.record()
in each, as the gateway does before the last bytes of a response. Hot-path cost is the extra
event-loop-thread CPU per request (encode, price, validate, group commit bookkeeping); fsyncs run
on the WAL thread and the database shipping runs in the background.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import structlog

from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.records import Price, UsageRecord


def make(i: int, run: str) -> UsageRecord:
    return UsageRecord(f"{run}-{i}", time.time(), f"team-{i % 7}", f"key-{i % 31}", None, "small", "openai",
                       "/v1/chat/completions", 120, 40, 40, "ok", 35.0, 4.0, "w-1")


async def drive(n: int, concurrency: int, ledger: Ledger | None, run: str) -> tuple[float, float, list[float]]:
    """Returns (wall seconds, loop-thread CPU seconds, record() latencies)."""
    counter = iter(range(n))
    latencies: list[float] = []

    async def handler() -> None:
        for i in counter:
            rec = make(i, run)
            await asyncio.sleep(0)  # the handler's own awaits (response streaming)
            if ledger is not None:
                t = time.perf_counter()
                await ledger.record(rec)
                latencies.append(time.perf_counter() - t)

    cpu, wall = time.thread_time(), time.perf_counter()
    await asyncio.gather(*(handler() for _ in range(concurrency)))
    return time.perf_counter() - wall, time.thread_time() - cpu, latencies


async def bench(database_url: str, wal_dir: Path, n: int, concurrency: int) -> None:
    pricing = PricingTable.static({"small": Price(100_000, 400_000)})
    ledger = await Ledger.open(database_url, wal_dir, pricing)
    try:
        await drive(2000, concurrency, ledger, "warm")
        await ledger.flush(60)
        off_wall, off_cpu, _ = await drive(n, concurrency, None, "off")
        on_wall, on_cpu, lat = await drive(n, concurrency, ledger, "on")
        t = time.perf_counter()
        await ledger.flush(120)
        ship = time.perf_counter() - t
        # one request at a time: every record pays a full fsync (the worst case for latency)
        single = []
        for i in range(200):
            t = time.perf_counter()
            await ledger.record(make(i, "single"))
            single.append(time.perf_counter() - t)
    finally:
        await ledger.close()
    lat.sort()
    single.sort()
    store = database_url.split(":", 1)[0]
    print(f"[{store}] {n} requests, concurrency {concurrency}")
    print(f"  ledger off: {n / off_wall:10.0f} req/s")
    print(f"  ledger on : {n / on_wall:10.0f} req/s   ratio on/off {off_wall / on_wall:.2f}")
    print(f"  hot-path cost (loop-thread CPU, on - off): {(on_cpu - off_cpu) / n * 1e6:.1f} us/request")
    print(f"  record() latency under load: p50 {lat[len(lat) // 2] * 1e3:.2f} ms, "
          f"p99 {lat[int(len(lat) * 0.99)] * 1e3:.2f} ms (waits for the shared fsync)")
    print(f"  record() alone (1 fsync each): median {statistics.median(single) * 1e3:.2f} ms")
    print(f"  backlog shipped to the database {ship * 1e3:.0f} ms after the load ended")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--database-url", action="append", help="default: a temporary SQLite file")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    with tempfile.TemporaryDirectory(prefix="sluice-bench-ledger-") as tmp:
        for i, url in enumerate(args.database_url or [f"sqlite:///{tmp}/billing.db"]):
            asyncio.run(bench(url, Path(tmp) / f"wal-{i}", args.requests, args.concurrency))


if __name__ == "__main__":
    main()
