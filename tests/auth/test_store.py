"""Store start-up: versioned migrations applied once (also under concurrent starts), WAL on SQLite."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from auth import AuthService
from auth.store import open_store
from auth.store.migrations import MIGRATIONS
from storage.migrations import TABLE
from tests.auth.helpers import PEPPER


async def test_migrations_are_versioned_and_applied_once(store_url):
    stores = await asyncio.gather(*(open_store(store_url) for _ in range(3)))  # concurrent starts
    try:
        rows = await stores[0].db.fetchall(f"SELECT version FROM {TABLE} WHERE package = 'auth' ORDER BY version")
        assert [r[0] for r in rows] == [m.version for m in MIGRATIONS]
    finally:
        for store in stores:
            await store.close()
    again = await open_store(store_url)
    try:
        rows = await again.db.fetchall(f"SELECT version FROM {TABLE} WHERE package = 'auth'")
        assert len(rows) == len(MIGRATIONS)
    finally:
        await again.close()


async def test_sqlite_uses_wal(store_url):
    store = await open_store(store_url)
    try:
        if store.db.dialect == "sqlite":
            assert (await store.db.fetchone("PRAGMA journal_mode"))[0] == "wal"
    finally:
        await store.close()


async def test_concurrent_bootstrap_creates_once(store_url):
    services = [await AuthService.open(store_url, PEPPER) for _ in range(3)]
    try:
        results = await asyncio.gather(*(s.bootstrap(None) for s in services))
        assert sum(r.first_key is not None for r in results) == 1
        assert len({r.default_team_id for r in results}) == 1
        assert len(await services[0].admin.list_keys()) == 2
    finally:
        for s in services:
            await s.close()


async def test_unknown_url_scheme_is_refused():
    with pytest.raises(ValueError, match="sqlite:// or postgresql://"):
        await AuthService.open("mysql://x", PEPPER)



async def test_hot_path_survives_dropped_postgres_connections(postgres_url):
    """The server ending every session (restart, failover) costs no failed request."""
    store_url = postgres_url
    service = await AuthService.open(store_url, PEPPER, cache_ttl=0.0)  # every call reads the store
    try:
        boot = await service.bootstrap(None)
        await service.authenticate(f"Bearer {boot.first_key}", None, "c")
        admin = await asyncpg.connect(store_url)
        try:
            killed = await admin.fetchval("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                          "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        finally:
            await admin.close()
        assert killed >= 1
        for _ in range(3):
            assert (await service.authenticate(f"Bearer {boot.first_key}", None, "c")).key_id
    finally:
        await service.close()
