"""Run as a child process by the crash tests: records usage from many concurrent tasks and prints
each request id once record() has returned, until it is killed.

    python -m tests.billing.crash_writer DATABASE_URL WAL_DIR
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import structlog

from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.records import Price, UsageRecord


async def main(database_url: str, wal_dir: Path) -> None:
    ledger = await Ledger.open(database_url, wal_dir, PricingTable.static({"small": Price(100_000, 400_000)}),
                               max_segment_bytes=64 << 10)  # small segments: the kill lands mid-rotation too
    pid = os.getpid()
    counter = iter(range(10**9))

    async def client(worker: int) -> None:
        while True:
            rid = f"crash-{pid}-{next(counter)}"
            await ledger.record(UsageRecord(rid, time.time(), f"team-{worker % 3}", "key-1", None, "small",
                                            "openai", "/v1/completions", 7, 3, 3, "ok", 1.0, 0.5, "w-1"))
            os.write(1, f"{rid}\n".encode())  # unbuffered: in the pipe before the next await

    os.write(1, b"ready\n")
    await asyncio.gather(*(client(i) for i in range(64)))


if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout carries the ids
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
