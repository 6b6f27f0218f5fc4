"""Auth persistence: `open_store(url)` takes the database's shared pool (storage) and applies the auth schema."""

from __future__ import annotations

import storage
from auth.clock import now
from auth.store.migrations import SCHEMA
from auth.store.sql import Store
from storage import Conflict


async def open_store(url: str) -> Store:
    db = await storage.open(url, store="key store (auth database)", code="auth_unavailable")
    try:
        await storage.migrate(db, SCHEMA, now())
    except BaseException:
        await db.close()
        raise
    return Store(db)


__all__ = ["Conflict", "Store", "open_store"]
