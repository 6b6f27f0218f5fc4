"""Opening a SQLite file in WAL mode when other connections may be opening it at the same moment.

Two things went wrong when several stores opened one new file at once (CI):
- `PRAGMA journal_mode=WAL` answers with a row. Left unread, its statement stays active and holds a
  read transaction, and every other connection's switch waits for it until the busy timeout.
  Reading the row ends it.
- Two connections that both hold the shared lock and both want the exclusive one to switch would
  deadlock, so SQLite fails one at once with "database is locked", without waiting on the busy
  timeout. That one retries after a short random pause, by which time the other has switched.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from pathlib import Path

import aiosqlite

BUSY_TIMEOUT_S = 10.0
_RETRY_S = (0.005, 0.05)  # random pause before another try, so that racing openers fall out of step


async def connect_wal(path: str | Path, timeout_s: float = BUSY_TIMEOUT_S) -> aiosqlite.Connection:
    """An autocommit connection in WAL mode, with `timeout_s` as its busy timeout. A failed open
    closes the connection: its thread would otherwise keep the process from exiting."""
    # timeout= installs the busy handler before the first statement
    conn = await aiosqlite.connect(path, isolation_level=None, timeout=timeout_s)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                async with conn.execute("PRAGMA journal_mode=WAL") as cursor:
                    await cursor.fetchall()
                return conn
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
            await asyncio.sleep(random.uniform(*_RETRY_S))
    except BaseException:
        await conn.close()
        raise
