"""Run as a child process by the durability tests: a gateway's usage log on a shared WAL root,
recording until killed, printing each request id once record() has returned (it is durable then).

    python -m tests.infra.wal_owner WAL_ROOT DATABASE_URL
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
from billing.wal_home import WalHome


async def main(wal_root: str, database_url: str) -> None:
    home = WalHome.claim(Path(wal_root), wal_root)
    ledger = await Ledger.open(database_url, home.path, PricingTable.static({"small": Price(100_000, 400_000)}))
    counter = iter(range(10**9))
    os.write(1, f"home {home.path.name}\n".encode())

    async def client() -> None:
        while True:
            rid = f"owner-{os.getpid()}-{next(counter)}"
            await ledger.record(UsageRecord(rid, time.time(), "team-1", "key-1", None, "small", "openai",
                                            "/v1/completions", 7, 3, 3, "ok", 1.0, 0.5, "w-1"))
            os.write(1, f"{rid}\n".encode())
            await asyncio.sleep(0.001)

    await asyncio.gather(*(client() for _ in range(8)))


if __name__ == "__main__":
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))  # stdout carries the ids
    asyncio.run(main(sys.argv[1], sys.argv[2]))
