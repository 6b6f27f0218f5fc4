"""Auth persistence: `open_store(url)` picks SQLite or PostgreSQL by URL and applies migrations."""

from __future__ import annotations

from auth.clock import now
from auth.store.db import Conflict, connect
from auth.store.migrations import migrate
from auth.store.sql import Store


async def open_store(url: str) -> Store:
    db = await connect(url)
    try:
        await migrate(db, now())
    except BaseException:
        await db.close()
        raise
    return Store(db)


__all__ = ["Conflict", "Store", "open_store"]
