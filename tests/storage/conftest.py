"""Every storage test runs against a real SQLite file (in tmp_path) and a real PostgreSQL database (a fresh one
per test on the session's server)."""

from __future__ import annotations

import uuid
from pathlib import Path

import asyncpg
import pytest


async def _admin(server_url: str, statement: str) -> None:
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
async def postgres_url(postgres):
    """A new, empty database on the session's server, dropped afterwards."""
    name = f"storage_{uuid.uuid4().hex[:12]}"
    await _admin(postgres.url, f'CREATE DATABASE "{name}"')
    yield postgres.url.rsplit("/", 1)[0] + "/" + name
    await _admin(postgres.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'storage.db'}"
    return request.getfixturevalue("postgres_url")
