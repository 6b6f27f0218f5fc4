"""Fresh PostgreSQL databases on a running server (testkit.servers.postgres_server): one per test or module, so
that tests sharing the session's server never see each other's rows."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import asyncpg


async def create_database(server_url: str, prefix: str = "test") -> str:
    """A new, empty database on the server at `server_url`; its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    connection = await asyncpg.connect(server_url)
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    return server_url.rsplit("/", 1)[0] + "/" + name


async def drop_database(server_url: str, url: str) -> None:
    """Drop the database at `url` (made by create_database), its sessions cut."""
    connection = await asyncpg.connect(server_url)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')
    finally:
        await connection.close()


@contextlib.asynccontextmanager
async def fresh_database(server, prefix: str = "test") -> AsyncIterator[str]:
    """A new, empty database on `server` (a PostgresServer), dropped afterwards; yields its URL."""
    url = await create_database(server.url, prefix)
    try:
        yield url
    finally:
        await drop_database(server.url, url)
