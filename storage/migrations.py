"""The one migration runner: each package keeps its numbered schema versions as data (a `Schema`), and
`migrate` applies those the database has not recorded yet, in order, each once, in one exclusive
transaction (so gateways starting together on one database migrate one at a time).

Every package's applied versions are recorded in one table, `schema_migrations`, keyed by package.
Databases made before it kept a table per package (`auth_schema_migrations`, …): a schema names its
old table, and the first run copies that table's versions over and drops it, in the same transaction.

Append new versions; never edit an applied one. A version's SQL is either one list valid for every
database, or one list per dialect (`{"sqlite": [...], "postgres": [...]}`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from storage.database import Database, Dialect, Executor

TABLE = "schema_migrations"
_CREATE = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    package TEXT NOT NULL, version INTEGER NOT NULL, description TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (package, version))"""
_TABLE_EXISTS: dict[Dialect, str] = {
    "sqlite": "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
    "postgres": ("SELECT 1 FROM information_schema.tables WHERE table_name = ? "
                 "AND table_schema = ANY(current_schemas(false))"),
}


class Migration(NamedTuple):
    version: int
    description: str
    statements: Sequence[str] | Mapping[Dialect, Sequence[str]]

    def sql(self, dialect: Dialect) -> Sequence[str]:
        return self.statements[dialect] if isinstance(self.statements, Mapping) else self.statements


@dataclass(frozen=True)
class Schema:
    """`package`: its key in the bookkeeping table. `legacy_table`: where the package recorded its
    versions before the one table, adopted on the first run."""

    package: str
    migrations: Sequence[Migration]
    legacy_table: str | None = None

    def __post_init__(self) -> None:
        versions = [m.version for m in self.migrations]
        if not versions or versions[0] < 1 or any(a >= b for a, b in zip(versions, versions[1:])):
            raise ValueError(f"the {self.package} schema's versions must be ascending from 1 or more "
                             f"without repeats, got {versions}")


async def migrate(db: Database, schema: Schema, now: float | None = None) -> list[int]:
    """Apply the versions of `schema` not yet recorded; returns those applied."""
    now = time.time() if now is None else now
    async with db.transaction(lock="migrations") as tx:
        await tx.execute(_CREATE)
        if schema.legacy_table is not None:
            await _adopt(tx, db.dialect, schema, schema.legacy_table)
        rows = await tx.fetchall(f"SELECT version FROM {TABLE} WHERE package = ?", (schema.package,))
        done = {row[0] for row in rows}
        applied = []
        for migration in schema.migrations:
            if migration.version in done:
                continue
            for statement in migration.sql(db.dialect):
                await tx.execute(statement)
            await tx.execute(f"INSERT INTO {TABLE} (package, version, description, applied_at) VALUES (?, ?, ?, ?)",
                             (schema.package, migration.version, migration.description, now))
            applied.append(migration.version)
        return applied


class MigratedOnFirstUse:
    """`await it()`: the database, with `schema` applied on the first call of this process (concurrent first
    callers wait for the one run): a store migrates when it is first used, not when it is built."""

    def __init__(self, db: Database, schema: Schema) -> None:
        self.db, self.schema = db, schema
        self._ready = False
        self._lock = asyncio.Lock()

    async def __call__(self) -> Database:
        if not self._ready:
            async with self._lock:
                if not self._ready:
                    await migrate(self.db, self.schema)
                    self._ready = True
        return self.db


async def _adopt(tx: Executor, dialect: Dialect, schema: Schema, legacy: str) -> None:
    """Copy the versions recorded in the package's old table, then drop it."""
    if await tx.fetchone(_TABLE_EXISTS[dialect], (legacy,)) is None:
        return
    described = {m.version: m.description for m in schema.migrations}
    for version, applied_at in await tx.fetchall(f"SELECT version, applied_at FROM {legacy}"):
        await tx.execute(f"INSERT INTO {TABLE} (package, version, description, applied_at) VALUES (?, ?, ?, ?) "
                         "ON CONFLICT DO NOTHING",
                         (schema.package, version, described.get(version, "recorded before this code"), applied_at))
    await tx.execute(f"DROP TABLE {legacy}")
