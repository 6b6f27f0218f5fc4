"""Usage stores: SQLite (embedded default) and PostgreSQL, one interface, on the database's shared pool
(storage)."""

from __future__ import annotations

import storage
from billing.store.base import UsageStore
from billing.store.postgres import PostgresStore
from billing.store.schema import SCHEMA
from billing.store.sqlite import SqliteStore


async def open_store(database_url: str) -> UsageStore:
    db = await storage.open(database_url, store="usage store (billing database)", code="usage_unavailable")
    try:
        await storage.migrate(db, SCHEMA)
    except BaseException:
        await db.close()
        raise
    return PostgresStore(db) if db.dialect == "postgres" else SqliteStore(db)


__all__ = ["UsageStore", "open_store"]
