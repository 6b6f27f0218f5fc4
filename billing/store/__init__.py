"""Usage stores: SQLite (embedded default) and PostgreSQL, one interface."""

from __future__ import annotations

from billing.store.base import UsageStore


async def open_store(database_url: str) -> UsageStore:
    if database_url.startswith(("postgresql://", "postgres://")):
        from billing.store.postgres import PostgresStore

        return await PostgresStore.open(database_url)
    from billing.store.sqlite import SqliteStore

    return await SqliteStore.open(database_url)


__all__ = ["UsageStore", "open_store"]
