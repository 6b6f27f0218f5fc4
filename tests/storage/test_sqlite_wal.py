"""sqlite_wal.connect_wal: many connections opening one new file at once all end up in WAL mode
(in CI they failed with "database is locked": see the module's docstring)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from storage.sqlite_wal import connect_wal


@pytest.mark.parametrize("attempt", range(20))
async def test_concurrent_opens_of_a_new_file_all_get_wal(tmp_path, attempt):
    path = tmp_path / f"shared-{attempt}.db"
    conns = await asyncio.gather(*(connect_wal(path) for _ in range(8)))
    try:
        for conn in conns:
            async with conn.execute("PRAGMA journal_mode") as cursor:
                assert (await cursor.fetchone())[0] == "wal"
        await conns[0].execute("CREATE TABLE t (x INTEGER)")
        await conns[1].execute("INSERT INTO t VALUES (1)")
        async with conns[7].execute("SELECT x FROM t") as cursor:
            assert await cursor.fetchall() == [(1,)]
    finally:
        for conn in conns:
            await conn.close()


async def test_a_failed_open_raises_and_closes_its_connection(tmp_path):
    before = set(threading.enumerate())
    (tmp_path / "not-a-db").write_bytes(b"this is not a SQLite database file, just text " * 40)
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        await connect_wal(tmp_path / "not-a-db")
    started = [t for t in threading.enumerate() if t not in before]
    for thread in started:  # aiosqlite's connection thread ends once the connection is closed
        thread.join(timeout=5)
    assert not any(t.is_alive() for t in started)
