"""What a PostgreSQL server says about a database's open connections, for the one-pool-per-URL tests."""

from __future__ import annotations

import asyncpg


async def backends(server_url: str, database: str) -> int:
    """The connections open to `database` now, as the server counts them."""
    conn = await asyncpg.connect(server_url)
    try:
        return await conn.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = $1", database)
    finally:
        await conn.close()
