"""The embedded usage store: one SQLite file (WAL journal), reached through aiosqlite."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiosqlite

from billing.records import LedgerEntry
from billing.store.base import (
    COLUMNS,
    MIGRATIONS_TABLE,
    TABLE,
    aggregate_sql,
    entry_row,
    records_sql,
    row_entry,
    to_rows,
)
from billing.store.schema import MIGRATIONS_DDL, SQLITE_MIGRATIONS
from storage.errors import unavailable_when_down
from storage.sqlite_wal import connect_wal

_INSERT = (f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
           "ON CONFLICT (request_id) DO NOTHING")


def _unavailable():
    return unavailable_when_down("usage store (billing database)", "usage_unavailable")


def _qmark(_: int) -> str:
    return "?"


def sqlite_path(url: str) -> Path:
    """`sqlite:///abs/path.db`, `sqlite:relative.db` or a bare path."""
    if url.startswith("sqlite:"):
        url = url[len("sqlite:"):]
        url = url.removeprefix("//")
    return Path(url)


class SqliteStore:
    def __init__(self, db: aiosqlite.Connection) -> None:
        self._db = db
        self._lock = asyncio.Lock()  # one connection: keep each transaction whole

    @classmethod
    async def open(cls, url: str) -> SqliteStore:
        path = sqlite_path(url)
        with _unavailable():
            path.parent.mkdir(parents=True, exist_ok=True)
            db = await connect_wal(path)  # the auth package may open the same file at the same moment
            try:
                await db.execute("PRAGMA synchronous=FULL")  # the WAL segment is deleted once this commit returns
                store = cls(db)
                await store._migrate()
            except BaseException:
                await db.close()  # an unclosed connection's thread would keep the process from exiting
                raise
        return store

    async def _migrate(self) -> None:
        async with self._lock:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                await self._db.execute(MIGRATIONS_DDL)
                async with self._db.execute(f"SELECT version FROM {MIGRATIONS_TABLE}") as cur:
                    done = {row[0] for row in await cur.fetchall()}
                for version, statements in enumerate(SQLITE_MIGRATIONS, start=1):
                    if version in done:
                        continue
                    for sql in statements:
                        await self._db.execute(sql)
                    await self._db.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES (?, ?)", (version, time.time()))
                await self._db.execute("COMMIT")
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise

    async def insert(self, entries: list[LedgerEntry]) -> int:
        async with self._lock:
            with _unavailable():
                before = self._db.total_changes
                await self._db.execute("BEGIN IMMEDIATE")
                try:
                    await self._db.executemany(_INSERT, [entry_row(e) for e in entries])
                    await self._db.execute("COMMIT")
                except BaseException:
                    await self._db.execute("ROLLBACK")
                    raise
                return self._db.total_changes - before

    async def aggregate(self, query) -> list:
        sql, params = aggregate_sql(query, _qmark)
        with _unavailable():
            async with self._db.execute(sql, params) as cur:
                return to_rows(await cur.fetchall())

    async def records(self, query) -> list[LedgerEntry]:
        sql, params = records_sql(query, _qmark)
        with _unavailable():
            async with self._db.execute(sql, params) as cur:
                return [row_entry(r) for r in await cur.fetchall()]

    async def count(self, request_ids: list[str]) -> dict[str, int]:
        counts = dict.fromkeys(request_ids, 0)
        for i in range(0, len(request_ids), 500):
            chunk = request_ids[i:i + 500]
            sql = f"SELECT request_id, COUNT(*) FROM {TABLE} WHERE request_id IN ({', '.join('?' * len(chunk))}) GROUP BY request_id"
            with _unavailable():
                async with self._db.execute(sql, chunk) as cur:
                    for rid, n in await cur.fetchall():
                        counts[rid] = n
        return counts

    async def close(self) -> None:
        await self._db.close()
