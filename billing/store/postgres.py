"""The scale-out usage store: PostgreSQL, on the database's shared pool. A pool connection that died with
the server is replaced on the next acquire, so the shipper's retries reconnect by themselves."""

from __future__ import annotations

from typing import Any

from billing.records import LedgerEntry
from billing.store import failure_rollup, latency_rollup
from billing.store.base import COLUMNS, TABLE, AlertStates, entry_row
from billing.store.rollups import rollup_rows, upserts
from storage import Database
from storage.sql_dialect import PostgresDialect, SqlDialect

_COLUMN_TYPES = ("text", "float8", "text", "text", "text", "text", "text", "text", "text", "int8", "int8",
                 "int8", "text", "float8", "float8", "text", "int8", "int8", "int8", "float8",
                 "float8", "text", "int4", "text", "text", "text",
                 "int8", "text", "text", "int8", "int4", "int8", "int8", "int8", "int8", "text", "text")
# One statement per batch: unnest the column arrays; ON CONFLICT makes re-shipping harmless.
_INSERT = (f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) SELECT * FROM unnest("
           + ", ".join(f"?::{t}[]" for t in _COLUMN_TYPES)
           + ") ON CONFLICT (request_id) DO NOTHING RETURNING request_id")
_DIALECT = PostgresDialect()
_ARRAYS = {"text": "text", "integer": "int8", "real": "float8"}
_UPSERT_DAILY, _UPSERT_HOURLY = upserts(_DIALECT, arrays=_ARRAYS)
_UPSERT_LATENCY = latency_rollup.upsert(_DIALECT, arrays=_ARRAYS)
_UPSERT_FAILURES = failure_rollup.upsert(_DIALECT, arrays=_ARRAYS)


class PostgresStore(AlertStates):
    dialect: SqlDialect = _DIALECT

    def __init__(self, db: Database) -> None:
        self._db = db

    async def insert(self, entries: list[LedgerEntry]) -> int:
        columns = list(zip(*(entry_row(e) for e in entries), strict=True))
        # no lock: concurrent inserts conflict only on their own rows, and the rollup rows are
        # locked in key order (rollups.py)
        async with self._db.transaction() as tx:
            inserted = {row[0] for row in await tx.fetchall(_INSERT, columns)}
            new: dict[str, LedgerEntry] = {}
            for e in entries:  # the rollups add exactly the records the insert added
                if e.usage.request_id in inserted:
                    new.setdefault(e.usage.request_id, e)
            daily, hourly = rollup_rows(list(new.values()))
            if daily:  # one statement per rollup: an array per column, as the insert
                await tx.execute(_UPSERT_DAILY, list(zip(*daily, strict=True)))
                await tx.execute(_UPSERT_HOURLY, list(zip(*hourly, strict=True)))
            latency = latency_rollup.latency_rows(list(new.values()))
            if latency:
                await tx.execute(_UPSERT_LATENCY, list(zip(*latency, strict=True)))
            failures = failure_rollup.failure_rows(list(new.values()))
            if failures:
                await tx.execute(_UPSERT_FAILURES, list(zip(*failures, strict=True)))
        return len(new)

    async def fetch(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        return await self._db.read(sql, params)

    async def count(self, request_ids: list[str]) -> dict[str, int]:
        counts = dict.fromkeys(request_ids, 0)
        rows = await self.fetch(f"SELECT request_id, COUNT(*) FROM {TABLE} WHERE request_id = ANY(?::text[]) "
                                "GROUP BY request_id", [request_ids])
        for rid, n in rows:
            counts[rid] = n
        return counts

    async def close(self) -> None:
        await self._db.close()
