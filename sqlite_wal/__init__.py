"""Opening a SQLite file in WAL mode when other connections may be opening it at the same moment.

`PRAGMA journal_mode=WAL` answers with a row. Left unread, its statement stays active and holds a
read transaction, and every other connection's switch to WAL waits for it until the busy timeout:
"database is locked" (CI, three stores opening one file at once). Reading the row ends it.
"""

from __future__ import annotations

from pathlib import Path

import aiosqlite

BUSY_TIMEOUT_S = 10.0


async def connect_wal(path: str | Path, timeout_s: float = BUSY_TIMEOUT_S) -> aiosqlite.Connection:
    """An autocommit connection in WAL mode, with `timeout_s` as its busy timeout. A failed open
    closes the connection: its thread would otherwise keep the process from exiting."""
    # timeout= installs the busy handler before the first statement
    conn = await aiosqlite.connect(path, isolation_level=None, timeout=timeout_s)
    try:
        async with conn.execute("PRAGMA journal_mode=WAL") as cursor:
            await cursor.fetchall()
    except BaseException:
        await conn.close()
        raise
    return conn
