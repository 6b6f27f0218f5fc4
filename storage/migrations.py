"""Numbered schema versions applied in order, each once, in one locked transaction.

Each package keeps its own list and its own bookkeeping table; append new versions, never edit an
applied one. The SQL of a version must be valid for every database the package opens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from auth.store.db import Database

Migration = tuple[int, str, Sequence[str]]  # version, description, statements


async def apply_migrations(db: Database, table: str, migrations: Sequence[Migration], now: float) -> list[int]:
    """Apply the versions not yet recorded in `table`; returns the versions applied."""
    async with db.transaction() as tx:
        await tx.execute(f"""CREATE TABLE IF NOT EXISTS {table} (
            version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)""")
        done = {row[0] for row in await tx.fetchall(f"SELECT version FROM {table}")}
        applied = []
        for version, description, statements in migrations:
            if version in done:
                continue
            for statement in statements:
                await tx.execute(statement)
            await tx.execute(f"INSERT INTO {table} (version, description, applied_at) VALUES (?, ?, ?)",
                             (version, description, now))
            applied.append(version)
        return applied
