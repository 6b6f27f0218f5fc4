"""storage.open: one pool per database URL, shared by every handle; the last close closes it; a failed open is
not kept; each handle names its own store in the errors it raises."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

import storage
from common.errors import StoreUnavailable
from tests.storage.connections import backends


async def test_opening_a_url_twice_gives_the_same_pool(database_url):
    first = await storage.open(database_url)
    second, third = await asyncio.gather(storage.open(database_url), storage.open(database_url))
    try:
        assert first.pool is second.pool is third.pool
        await first.execute("CREATE TABLE shared (x INTEGER)")
        await second.execute("INSERT INTO shared VALUES (1)")
        assert await third.fetchall("SELECT x FROM shared") == [(1,)]
    finally:
        for db in (first, second, third):
            await db.close()


async def test_the_pool_closes_with_its_last_handle(database_url):
    first = await storage.open(database_url)
    second = await storage.open(database_url)
    await first.execute("CREATE TABLE kept (x INTEGER)")
    await first.close()
    await first.close()  # a handle releases its share once, however often it is closed
    await second.execute("INSERT INTO kept VALUES (2)")  # the pool still serves the other handle
    assert await second.read("SELECT x FROM kept") == [(2,)]
    pool = second.pool
    await second.close()
    with pytest.raises(Exception):  # noqa: B017 - closed: the driver refuses, whatever its error
        await pool.fetchall("SELECT x FROM kept")
    again = await storage.open(database_url)
    try:
        assert again.pool is not pool
        assert await again.fetchall("SELECT x FROM kept") == [(2,)]
    finally:
        await again.close()


async def test_postgres_connections_are_one_pools_and_closed_at_the_end(postgres, postgres_url):
    name = postgres_url.rsplit("/", 1)[1]
    handles = [await storage.open(postgres_url) for _ in range(6)]
    await asyncio.gather(*(db.fetchall("SELECT pg_sleep(0.05)") for db in handles for _ in range(4)))
    open_now = await backends(postgres.url, name)
    assert 1 <= open_now <= storage.postgres.POOL_SIZE
    for db in handles:
        await db.close()
    assert await backends(postgres.url, name) == 0


async def test_a_failed_open_is_not_kept(postgres):
    url = postgres.url.rsplit("/", 1)[0] + "/storage_later"
    with pytest.raises(StoreUnavailable) as failed:
        await storage.open(url, store="usage store (billing database)", code="usage_unavailable")
    assert failed.value.code == "usage_unavailable" and "usage store" in str(failed.value)
    admin = await asyncpg.connect(postgres.url)
    try:
        await admin.execute("CREATE DATABASE storage_later")
        db = await storage.open(url)  # the database exists now: this open connects afresh
        try:
            assert await db.fetchone("SELECT 1") == (1,)
        finally:
            await db.close()
    finally:
        await admin.execute("DROP DATABASE IF EXISTS storage_later WITH (FORCE)")
        await admin.close()


async def test_each_handle_names_its_store(database_url):
    auth = await storage.open(database_url, store="key store (auth database)", code="auth_unavailable")
    usage = await storage.open(database_url, store="usage store (billing database)", code="usage_unavailable")
    try:
        assert auth.pool is usage.pool
        for db, code in ((auth, "auth_unavailable"), (usage, "usage_unavailable")):
            with pytest.raises(StoreUnavailable) as failed:
                await db.fetchall("SELECT * FROM no_such_table")
            assert failed.value.code == code
            assert "no_such_table" in str(failed.value.__cause__)
    finally:
        await auth.close()
        await usage.close()


async def test_spellings_of_one_sqlite_file_share_a_pool(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    absolute = await storage.open(f"sqlite:///{tmp_path / 'one.db'}")
    relative = await storage.open("sqlite:one.db")
    try:
        assert absolute.pool is relative.pool
    finally:
        await absolute.close()
        await relative.close()


@pytest.mark.parametrize("url", ["mysql://db/x", "/var/lib/sluice.db", "sqlite://", ""])
async def test_a_url_of_no_known_database_is_refused(url):
    with pytest.raises(ValueError, match="sqlite"):
        await storage.open(url)
