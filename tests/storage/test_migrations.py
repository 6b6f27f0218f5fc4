"""storage.migrate: a package's versions applied in order, each once, recorded in the one table, also when
several processes start on one database at the same moment; a failing version leaves nothing behind."""

from __future__ import annotations

import asyncio

import pytest

import storage
from common.errors import StoreUnavailable
from storage import Database, Migration, Schema
from storage.migrations import TABLE
from storage.registry import connect

# each version needs the one before it: applied out of order, or twice, it fails
V1 = Migration(1, "a table", ["CREATE TABLE notes (id TEXT PRIMARY KEY)"])
V2 = Migration(2, "a column", ["ALTER TABLE notes ADD COLUMN body TEXT"])
V3 = Migration(3, "a row in the new column", ["INSERT INTO notes (id, body) VALUES ('first', 'v3')"])


async def recorded(db: Database, package: str) -> list[tuple]:
    return await db.fetchall(f"SELECT version, description FROM {TABLE} WHERE package = ? ORDER BY version",
                             (package,))


async def test_versions_apply_in_order_and_each_once(database_url):
    db = await storage.open(database_url)
    try:
        assert await storage.migrate(db, Schema("notes", [V1, V2])) == [1, 2]
        assert await storage.migrate(db, Schema("notes", [V1, V2])) == []
        # a version appended later is the only one applied at the next start
        assert await storage.migrate(db, Schema("notes", [V1, V2, V3])) == [3]
        assert await recorded(db, "notes") == [(1, "a table"), (2, "a column"), (3, "a row in the new column")]
        assert await db.fetchall("SELECT id, body FROM notes") == [("first", "v3")]
    finally:
        await db.close()


async def test_packages_keep_their_own_versions_in_the_one_table(database_url):
    db = await storage.open(database_url)
    try:
        await storage.migrate(db, Schema("notes", [V1]))
        other = Schema("other", [Migration(1, "another table", ["CREATE TABLE other (id TEXT)"])])
        assert await storage.migrate(db, other) == [1]
        assert await recorded(db, "notes") == [(1, "a table")]
        assert await recorded(db, "other") == [(1, "another table")]
    finally:
        await db.close()


async def test_a_version_may_differ_per_dialect(database_url):
    db = await storage.open(database_url)
    try:
        which = Migration(1, "per dialect", {"sqlite": ["CREATE TABLE which (name TEXT DEFAULT 'sqlite')"],
                                             "postgres": ["CREATE TABLE which (name TEXT DEFAULT 'postgres')"]})
        await storage.migrate(db, Schema("which", [which]))
        await db.execute("INSERT INTO which DEFAULT VALUES")
        assert await db.fetchall("SELECT name FROM which") == [(db.dialect,)]
    finally:
        await db.close()


@pytest.mark.parametrize("processes", [2, 6])
async def test_concurrent_starts_apply_each_version_once(database_url, processes):
    """Gateways starting together: each has pools of its own (not the shared registry), as separate processes
    would; every one migrates at once. Re-applying any version would fail (CREATE TABLE of an existing table)."""
    schema = Schema("notes", [V1, V2, V3])
    dbs = [Database(await connect(database_url)) for _ in range(processes)]
    try:
        applied = await asyncio.gather(*(storage.migrate(db, schema) for db in dbs))
        assert sorted(v for versions in applied for v in versions) == [1, 2, 3]
        assert sum(bool(versions) for versions in applied) == 1  # one transaction applies them all
        assert [v for v, _ in await recorded(dbs[-1], "notes")] == [1, 2, 3]
        assert await dbs[0].fetchall("SELECT id, body FROM notes") == [("first", "v3")]
    finally:
        for db in dbs:
            await db.close()


async def test_a_failing_version_leaves_nothing_of_its_run_applied(database_url):
    db = await storage.open(database_url)
    try:
        await storage.migrate(db, Schema("notes", [V1]))
        broken = Migration(3, "broken", ["CREATE TABLE fine (id TEXT)", "CREATE TABLE notes (id TEXT)"])
        with pytest.raises(StoreUnavailable):  # the driver's error is its cause
            await storage.migrate(db, Schema("notes", [V1, V2, broken]))
        assert [v for v, _ in await recorded(db, "notes")] == [1]
        # v2 was rolled back with the version after it: it applies again
        assert await storage.migrate(db, Schema("notes", [V1, V2])) == [2]
    finally:
        await db.close()


@pytest.mark.parametrize("versions", [[], [0], [2, 1], [1, 1], [1, 3, 2]])
def test_versions_must_ascend_from_one_without_repeats(versions):
    with pytest.raises(ValueError, match="ascending"):
        Schema("bad", [Migration(v, f"v{v}", []) for v in versions])
