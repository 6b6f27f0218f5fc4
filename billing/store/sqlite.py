"""The embedded usage store: one SQLite file (WAL journal). Its one writing connection keeps each insert
whole; reads run on the database's read-only connections, in parallel with each other and with the
writer, and see committed data only (storage/sqlite.py)."""

from __future__ import annotations

from typing import Any

from billing.records import LedgerEntry
from billing.store import failure_rollup, latency_rollup
from billing.store.base import COLUMNS, TABLE, AlertStates, entry_row
from billing.store.rollups import rollup_rows, upserts
from storage import Database, Executor
from storage.sql_dialect import SqlDialect, SqliteDialect

# no conflict target: a replayed entry collides with the primary key and the request_id index alike
_INSERT = (f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))}) "
           "ON CONFLICT DO NOTHING")
_DIALECT = SqliteDialect()
_UPSERT_DAILY, _UPSERT_HOURLY = upserts(_DIALECT)
_UPSERT_LATENCY = latency_rollup.upsert(_DIALECT)
_UPSERT_FAILURES = failure_rollup.upsert(_DIALECT)


class SqliteStore(AlertStates):
    dialect: SqlDialect = _DIALECT

    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert(self, entries: list[LedgerEntry]) -> int:
        async with self._db.transaction() as tx:
            new = await _new_entries(tx, entries)
            await tx.executemany(_INSERT, [entry_row(e) for e in new])
            daily, hourly = rollup_rows(new)
            await tx.executemany(_UPSERT_DAILY, daily)
            await tx.executemany(_UPSERT_HOURLY, hourly)
            await tx.executemany(_UPSERT_LATENCY, latency_rollup.latency_rows(new))
            await tx.executemany(_UPSERT_FAILURES, failure_rollup.failure_rows(new))
        return len(new)

    async def fetch(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        return await self._db.read(sql, params)

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
        await self._db.close()


async def _new_entries(tx: Executor, entries: list[LedgerEntry]) -> list[LedgerEntry]:
    """The entries whose request id is not stored yet, each once (inside the write transaction, so the
    rollups add exactly the records that the insert adds)."""
    ids = list({e.usage.request_id for e in entries})
    stored: set[str] = set()
    for i in range(0, len(ids), 500):
        chunk = ids[i:i + 500]
        rows = await tx.fetchall(f"SELECT request_id FROM {TABLE} WHERE request_id IN ({', '.join('?' * len(chunk))})",
                                 chunk)
        stored.update(row[0] for row in rows)
    new: dict[str, LedgerEntry] = {}
    for e in entries:
        if e.usage.request_id not in stored:
            new.setdefault(e.usage.request_id, e)
    return list(new.values())
