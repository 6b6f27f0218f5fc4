"""The SQLite driver: one file in WAL mode, reached through aiosqlite.

One writing connection in autocommit mode runs every statement that may write, one at a time (an
asyncio lock keeps other coroutines out of an open transaction); a few read-only connections, opened
on first use, answer `read` in parallel with each other and with the writer, and see committed data
only. Statements are the stores' one SQL, translated by `sql_text.sqlite` (row locks dropped: every transaction
here is exclusive). The writer syncs every commit (`synchronous=FULL`): the usage ledger deletes a log segment as
soon as the commit that stored it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any, cast

import aiosqlite

from storage.database import Dialect
from storage.errors import conflicts
from storage.sql_text import sqlite
from storage.sqlite_wal import connect_wal

READERS = 3
# without a row_factory (none is set) sqlite3 returns plain tuples; aiosqlite's stubs say `Row`
RowTuple = tuple[Any, ...]
_WRITER_PRAGMAS = ("PRAGMA foreign_keys=ON", "PRAGMA synchronous=FULL")
_READER_PRAGMAS = ("PRAGMA query_only=1", "PRAGMA cache_size=-65536", "PRAGMA mmap_size=268435456",
                   "PRAGMA temp_store=MEMORY")


async def _open(path: Path, pragmas: Sequence[str]) -> aiosqlite.Connection:
    conn = await connect_wal(path)
    try:
        for pragma in pragmas:
            await conn.execute(pragma)
    except BaseException:
        await conn.close()  # an unclosed connection's thread would keep the process from exiting
        raise
    return conn


class SqliteConnection:
    """The statements of one connection, integrity errors raised as `Conflict`."""

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> None:
        with conflicts():
            await self._conn.execute(sqlite(sql), tuple(args))

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with conflicts():
            await self._conn.executemany(sqlite(sql), [tuple(r) for r in rows])

    async def fetchone(self, sql: str, args: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        with conflicts():
            async with self._conn.execute(sqlite(sql), tuple(args)) as cur:
                return cast("RowTuple | None", await cur.fetchone())

    async def fetchall(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with conflicts():
            async with self._conn.execute(sqlite(sql), tuple(args)) as cur:
                return cast("list[RowTuple]", list(await cur.fetchall()))


class SqlitePool:
    dialect: Dialect = "sqlite"

    def __init__(self, path: Path, writer: aiosqlite.Connection) -> None:
        self.path = path
        self._writer = writer
        self._exec = SqliteConnection(writer)
        self._lock = asyncio.Lock()
        self._readers: list[aiosqlite.Connection] = []
        self._idle: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        self._opening = 0  # readers being opened, counted so that racing reads never open more than READERS

    @classmethod
    async def connect(cls, path: Path) -> SqlitePool:
        path.parent.mkdir(parents=True, exist_ok=True)
        return cls(path, await _open(path, _WRITER_PRAGMAS))

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> None:
        async with self._lock:
            await self._exec.execute(sql, args)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        async with self.transaction() as tx:
            await tx.executemany(sql, rows)

    async def fetchone(self, sql: str, args: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        async with self._lock:
            return await self._exec.fetchone(sql, args)

    async def fetchall(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        async with self._lock:
            return await self._exec.fetchall(sql, args)

    @contextlib.asynccontextmanager
    async def transaction(self, lock: str | None = None) -> AsyncIterator[SqliteConnection]:
        # every SQLite transaction is exclusive (so `lock` adds nothing): IMMEDIATE takes the write lock up
        # front, so that concurrent processes queue on the busy timeout instead of failing at their first write
        async with self._lock:
            await self._writer.execute("BEGIN IMMEDIATE")
            try:
                yield self._exec
            except BaseException:
                await self._writer.execute("ROLLBACK")
                raise
            await self._writer.execute("COMMIT")

    async def read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        reader = await self._reader()
        try:
            async with reader.execute(sqlite(sql), tuple(args)) as cur:
                return cast("list[RowTuple]", list(await cur.fetchall()))
        finally:
            self._idle.put_nowait(reader)

    async def _reader(self) -> aiosqlite.Connection:
        if self._idle.empty() and len(self._readers) + self._opening < READERS:
            self._opening += 1
            try:
                reader = await _open(self.path, _READER_PRAGMAS)
            finally:
                self._opening -= 1
            self._readers.append(reader)
            return reader
        return await self._idle.get()

    async def close(self) -> None:
        for reader in self._readers:
            await reader.close()
        await self._writer.close()
