"""The embedded usage store: one SQLite file (WAL journal), reached through aiosqlite. One
connection writes; a few read-only ones answer queries, in parallel with each other and with the
writer, and see committed data only."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import aiosqlite

from billing.records import LedgerEntry
from billing.store.base import COLUMNS, MIGRATIONS_TABLE, TABLE, entry_row
from billing.store.rollups import rollup_rows, upserts
from billing.store.schema import MIGRATIONS_DDL, SQLITE_MIGRATIONS
from billing.store.sql import SqliteDialect
from storage.errors import unavailable_when_down
from storage.sqlite_wal import connect_wal

# no conflict target: a replayed entry collides with the primary key and the request_id index alike
_INSERT = (f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
           "ON CONFLICT DO NOTHING")
_DIALECT = SqliteDialect()
_UPSERT_DAILY, _UPSERT_HOURLY = upserts(_DIALECT)
_READ_PRAGMAS = ("PRAGMA query_only=1", "PRAGMA cache_size=-65536", "PRAGMA mmap_size=268435456",
                 "PRAGMA temp_store=MEMORY")


def _unavailable():
    return unavailable_when_down("usage store (billing database)", "usage_unavailable")


def sqlite_path(url: str) -> Path:
    """`sqlite:///abs/path.db`, `sqlite:relative.db` or a bare path."""
    if url.startswith("sqlite:"):
        url = url[len("sqlite:"):]
        url = url.removeprefix("//")
    return Path(url)


class SqliteStore:
    dialect = _DIALECT

    def __init__(self, db: aiosqlite.Connection, readers: list[aiosqlite.Connection]) -> None:
        self._db = db
        self._lock = asyncio.Lock()  # one writing connection: keep each transaction whole
        self._readers: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        self._all_readers = readers
        for reader in readers:
            self._readers.put_nowait(reader)

    @classmethod
    async def open(cls, url: str, *, readers: int = 3) -> SqliteStore:
        path = sqlite_path(url)
        opened: list[aiosqlite.Connection] = []
        with _unavailable():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                db = await connect_wal(path)  # the auth package may open the same file at the same moment
                opened.append(db)
                await db.execute("PRAGMA synchronous=FULL")  # the WAL segment is deleted once this commit returns
                await _migrate(db)
                for _ in range(readers):
                    reader = await connect_wal(path)
                    opened.append(reader)
                    for pragma in _READ_PRAGMAS:
                        await reader.execute(pragma)
            except BaseException:
                for connection in opened:  # an unclosed connection's thread would keep the process from exiting
                    await connection.close()
                raise
        return cls(db, opened[1:])

    async def insert(self, entries: list[LedgerEntry]) -> int:
        async with self._lock:
            with _unavailable():
                await self._db.execute("BEGIN IMMEDIATE")
                try:
                    new = await self._new_entries(entries)
                    await self._db.executemany(_INSERT, [entry_row(e) for e in new])
                    daily, hourly = rollup_rows(new)
                    await self._db.executemany(_UPSERT_DAILY, daily)
                    await self._db.executemany(_UPSERT_HOURLY, hourly)
                    await self._db.execute("COMMIT")
                except BaseException:
                    await self._db.execute("ROLLBACK")
                    raise
                return len(new)

    async def _new_entries(self, entries: list[LedgerEntry]) -> list[LedgerEntry]:
        """The entries whose request id is not stored yet, each once (inside the write transaction,
        so the rollups add exactly the records that the insert adds)."""
        ids = list({e.usage.request_id for e in entries})
        stored: set[str] = set()
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            async with self._db.execute(f"SELECT request_id FROM {TABLE} WHERE request_id IN "
                                        f"({', '.join('?' * len(chunk))})", chunk) as cur:
                stored.update(row[0] for row in await cur.fetchall())
        new = {}
        for e in entries:
            if e.usage.request_id not in stored:
                new.setdefault(e.usage.request_id, e)
        return list(new.values())

    async def fetch(self, sql: str, params: list) -> list[tuple]:
        with _unavailable():
            async with self._reader() as reader, reader.execute(sql, params) as cur:
                return await cur.fetchall()

    async def count(self, request_ids: list[str]) -> dict[str, int]:
        counts = dict.fromkeys(request_ids, 0)
        for i in range(0, len(request_ids), 500):
            chunk = request_ids[i:i + 500]
            sql = (f"SELECT request_id, COUNT(*) FROM {TABLE} WHERE request_id IN ({', '.join('?' * len(chunk))}) "
                   "GROUP BY request_id")
            for rid, n in await self.fetch(sql, chunk):
                counts[rid] = n
        return counts

    async def close(self) -> None:
        for reader in self._all_readers:
            await reader.close()
        await self._db.close()

    @contextlib.asynccontextmanager
    async def _reader(self):
        reader = await self._readers.get()
        try:
            yield reader
        finally:
            self._readers.put_nowait(reader)


async def _migrate(db: aiosqlite.Connection) -> None:
    await db.execute("BEGIN IMMEDIATE")
    try:
        await db.execute(MIGRATIONS_DDL)
        async with db.execute(f"SELECT version FROM {MIGRATIONS_TABLE}") as cur:
            done = {row[0] for row in await cur.fetchall()}
        for version, statements in enumerate(SQLITE_MIGRATIONS, start=1):
            if version in done:
                continue
            for sql in statements:
                await db.execute(sql)
            await db.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES (?, ?)", (version, time.time()))
        await db.execute("COMMIT")
    except BaseException:
        await db.execute("ROLLBACK")
        raise
