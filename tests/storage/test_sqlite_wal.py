"""sqlite_wal.connect_wal: many connections opening one new file at once all end up in WAL mode
(with the switch's answer left unread, they locked each other out until the busy timeout)."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

import pytest

from sqlite_wal import connect_wal


@pytest.mark.parametrize("attempt", range(5))
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
    before = threading.active_count()
    (tmp_path / "not-a-db").write_bytes(b"this is not a SQLite database file, just text " * 40)
    with pytest.raises(sqlite3.DatabaseError, match="not a database"):
        await connect_wal(tmp_path / "not-a-db")
    assert threading.active_count() == before  # aiosqlite's thread ended with the closed connection
