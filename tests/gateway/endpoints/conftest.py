"""Endpoint fixtures: both databases the gateway opens (a SQLite file, a fresh PostgreSQL database)."""

from __future__ import annotations

import pytest

from tests.auth.conftest import fresh_postgres_database


@pytest.fixture(params=["sqlite", "postgres"])
async def database_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/sluice.db"
        return
    async with fresh_postgres_database(request.getfixturevalue("postgres")) as url:
        yield url
