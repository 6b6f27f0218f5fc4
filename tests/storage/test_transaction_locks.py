"""On PostgreSQL a transaction takes no database-wide lock (issue #46, item 4): one that names a lock waits only
for the transactions of that name, in any process, and every other write goes on beside it. Before, every
transaction took one advisory lock by default, so each stored response's insert waited for every other write.
(The quota a named lock protects, under concurrent writers: tests/gateway/dialects/test_response_store.py.)"""

from __future__ import annotations

import asyncio

import asyncpg

import storage
from storage.postgres import lock_id

HANG_GUARD_S = 120  # not a speed bound: a write held by the lock would never end without the release


async def _waiting_for(url: str, name: str) -> bool:
    """Whether some session waits for the advisory lock of `name` (pg_locks: not granted)."""
    number = lock_id(name) & 0xFFFF_FFFF_FFFF_FFFF
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT classid, objid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
    finally:
        await conn.close()
    return any((row["classid"] << 32 | row["objid"]) == number for row in rows)


async def test_a_named_lock_holds_up_only_the_writers_of_its_name(postgres_url):
    db = await storage.open(postgres_url)
    try:
        await db.execute("CREATE TABLE writes (who TEXT NOT NULL)")
        holding, release = asyncio.Event(), asyncio.Event()

        async def write(who: str, lock: str | None = None, hold: bool = False) -> None:
            async with db.transaction(lock=lock) as tx:
                await tx.execute("INSERT INTO writes (who) VALUES (?)", (who,))
                if hold:
                    holding.set()
                    await release.wait()

        holder = asyncio.create_task(write("holder", "identity", hold=True))
        await holding.wait()
        async with asyncio.timeout(HANG_GUARD_S):  # these never wait for the holder
            await asyncio.gather(*(write(f"ledger-{i}") for i in range(4)),  # no lock: their own rows
                                 write("responses", "stored-responses:team-a"), write("fleet", "fleet:org/model"))
        assert not holder.done()
        same = asyncio.create_task(write("same", "identity"))
        async with asyncio.timeout(HANG_GUARD_S):
            while not await _waiting_for(postgres_url, "identity"):  # it waits for the holder's lock
                assert not same.done()
                await asyncio.sleep(0.02)
        assert not same.done()
        release.set()
        async with asyncio.timeout(HANG_GUARD_S):
            await asyncio.gather(holder, same)
        rows = sorted(who for (who,) in await db.fetchall("SELECT who FROM writes"))
        assert rows == sorted(["holder", "same", "responses", "fleet", *(f"ledger-{i}" for i in range(4))])
    finally:
        await db.close()


def test_lock_names_map_to_distinct_stable_numbers():
    names = ["identity", "migrations", "fleet:a", "fleet:b", "stored-responses:team-a", "endpoint:x"]
    numbers = [lock_id(name) for name in names]
    assert len(set(numbers)) == len(names)
    assert all(-(2**63) <= n < 2**63 for n in numbers) and lock_id("identity") == numbers[0]
