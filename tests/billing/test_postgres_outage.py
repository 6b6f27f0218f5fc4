"""PostgreSQL goes away mid-run and comes back: record() keeps answering from the local log, and
every record reaches the database exactly once."""

from __future__ import annotations

import asyncio

from billing.ledger import Ledger
from billing.usage import UsageQuery
from testkit.databases import create_database
from testkit.servers import restarted_at_exit, take_down
from tests.billing.factory import usage


async def test_outage_mid_run_loses_and_duplicates_nothing(postgres, wal_dir, pricing):
    url = await create_database(postgres.url)
    ledger = await Ledger.open(url, wal_dir, pricing)
    acknowledged: list[str] = []
    stop = asyncio.Event()

    async def load() -> None:
        while not stop.is_set():
            batch = [usage() for _ in range(20)]
            await asyncio.gather(*(ledger.record(r) for r in batch))
            acknowledged.extend(r.request_id for r in batch)
            await asyncio.sleep(0.01)

    with restarted_at_exit(postgres):
        runner = asyncio.create_task(load())
        await asyncio.sleep(0.5)
        await asyncio.to_thread(take_down, postgres)
        during = len(acknowledged)
        # requests keep being recorded while the database is away, and the shipper has tried it meanwhile
        # (a wait for both, not a fixed spell a loaded machine may spend on neither)
        for _ in range(1200):
            if len(acknowledged) > during and ledger._shipper.failures:
                break
            await asyncio.sleep(0.05)
        assert len(acknowledged) > during and ledger._shipper.failures
        assert not ledger.caught_up
        await asyncio.to_thread(postgres.start)
        await asyncio.sleep(0.5)
        stop.set()
        await runner
    await ledger.flush(60)
    counts = await ledger.store.count(acknowledged)
    assert set(counts.values()) == {1}
    assert (await ledger.usage(UsageQuery(start=0, end=4e9, group_by="none"))).totals.requests == len(acknowledged)
    assert ledger._shipper.failures > 0  # the outage was really seen
    await ledger.close()


async def test_close_while_down_keeps_the_log_for_the_next_start(postgres, wal_dir, pricing):
    url = await create_database(postgres.url)
    ledger = await Ledger.open(url, wal_dir, pricing)
    first = [usage() for _ in range(50)]
    await asyncio.gather(*(ledger.record(r) for r in first))
    with restarted_at_exit(postgres):
        await asyncio.to_thread(take_down, postgres)
        second = [usage() for _ in range(50)]
        await asyncio.gather(*(ledger.record(r) for r in second))
        await ledger.close(timeout=1.0)
        assert any(wal_dir.iterdir())
        await asyncio.to_thread(postgres.start)
    ledger = await Ledger.open(url, wal_dir, pricing)
    counts = await ledger.store.count([r.request_id for r in first + second])
    assert set(counts.values()) == {1}
    await ledger.close()
    assert not any(wal_dir.iterdir())
