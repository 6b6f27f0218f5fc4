"""The scale-out usage store: PostgreSQL through an asyncpg pool. A pool connection that died with
the server is replaced on the next acquire, so the shipper's retries reconnect by themselves."""

from __future__ import annotations

import time

import asyncpg

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
from billing.store.schema import MIGRATIONS_DDL, POSTGRES_MIGRATIONS
from storage.errors import unavailable_when_down

_COLUMN_TYPES = ("text", "float8", "text", "text", "text", "text", "text", "text", "text", "int8", "int8",
                 "int8", "text", "float8", "float8", "text", "int8", "int8", "int8", "float8")
# One statement per batch: unnest the column arrays; ON CONFLICT makes re-shipping harmless.
_INSERT = (f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) SELECT * FROM unnest("
           + ", ".join(f"${i}::{t}[]" for i, t in enumerate(_COLUMN_TYPES, start=1))
           + ") ON CONFLICT (request_id) DO NOTHING")
_MIGRATION_LOCK = 0x5B11_B111  # advisory lock id: gateways starting together migrate one at a time


def _unavailable():
    return unavailable_when_down("usage store (billing database)", "usage_unavailable")


def _dollar(i: int) -> str:
    return f"${i}"


class PostgresStore:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @classmethod
    async def open(cls, url: str, *, idle_seconds: float = 60.0) -> PostgresStore:
        with _unavailable():
            pool = await asyncpg.create_pool(url, min_size=0, max_size=4, max_inactive_connection_lifetime=idle_seconds)
            store = cls(pool)
            try:
                await store._migrate()
            except BaseException:
                await pool.close()
                raise
        return store

    async def _migrate(self) -> None:
        async with self._pool.acquire() as con, con.transaction():
            await con.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
            await con.execute(MIGRATIONS_DDL)
            done = {r[0] for r in await con.fetch(f"SELECT version FROM {MIGRATIONS_TABLE}")}
            for version, statements in enumerate(POSTGRES_MIGRATIONS, start=1):
                if version in done:
                    continue
                for sql in statements:
                    await con.execute(sql)
                await con.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES ($1, $2)", version, time.time())

    async def insert(self, entries: list[LedgerEntry]) -> int:
        columns = list(zip(*(entry_row(e) for e in entries), strict=True))
        with _unavailable():
            async with self._pool.acquire() as con:
                status = await con.execute(_INSERT, *columns)
        return int(status.rsplit(" ", 1)[1])  # "INSERT 0 <n>"

    async def aggregate(self, query) -> list:
        sql, params = aggregate_sql(query, _dollar)
        with _unavailable():
            async with self._pool.acquire() as con:
                return to_rows(await con.fetch(sql, *params))

    async def records(self, query) -> list[LedgerEntry]:
        sql, params = records_sql(query, _dollar)
        with _unavailable():
            async with self._pool.acquire() as con:
                return [row_entry(r) for r in await con.fetch(sql, *params)]

    async def count(self, request_ids: list[str]) -> dict[str, int]:
        counts = dict.fromkeys(request_ids, 0)
        with _unavailable():
            async with self._pool.acquire() as con:
                rows = await con.fetch(f"SELECT request_id, COUNT(*) FROM {TABLE} WHERE request_id = ANY($1::text[]) "
                                       "GROUP BY request_id", request_ids)
        for rid, n in rows:
            counts[rid] = n
        return counts

    async def close(self) -> None:
        await self._pool.close()
