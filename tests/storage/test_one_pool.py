"""Through a real `sluice serve` whose auth, billing, endpoints and fleet state share one PostgreSQL URL: the
gateway holds one pool's worth of connections (and the fleet's one LISTEN connection for config changes,
gateway/endpoints/fleet_postgres.py), also under a burst that reaches every store at once, and none once it has
stopped (the pool is closed at shutdown)."""

from __future__ import annotations

import asyncio

import httpx

from storage.postgres import POOL_SIZE
from testkit.protocol_worker import MODEL, Reply, sluice_on_protocol_worker, tokens
from tests.storage.connections import backends

ADMIN_KEY = "storage-one-pool-admin-key-0123456789abcdef"
LISTENERS = 1  # the fleet's config-change listener: a LISTEN needs a connection of its own
BURST = 24  # concurrent calls of each kind: more than any one store's share of the pool



async def burst(url: str, api_key: str) -> list[int]:
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    user = {"Authorization": f"Bearer {api_key}"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        calls = [client.get("/admin/keys", headers=admin) for _ in range(BURST)]  # auth
        calls += [client.get("/admin/usage/records", headers=admin) for _ in range(BURST)]  # billing reads
        calls += [client.post("/v1/completions", headers=user,  # ledger writes
                              json={"model": MODEL, "prompt": "Hi", "max_tokens": 4}) for _ in range(BURST)]
        calls += [client.get("/admin/endpoints", headers=admin) for _ in range(BURST)]
        return [response.status_code for response in await asyncio.gather(*calls)]


async def settled_backends(server_url: str, database: str) -> int:
    """The connections open to `database`, an excess over one pool's worth looked at twice: a connection the pool
    replaces (one a cancelled query left unusable, say, on a loaded machine) can still be counted by the server for the
    moment its backend takes to exit, beside its replacement. A second pool's connections stay open."""
    count = await backends(server_url, database)
    if count > POOL_SIZE + LISTENERS:
        await asyncio.sleep(0.2)
        count = min(count, await backends(server_url, database))
    return count


async def test_one_url_gives_one_pool_and_shutdown_closes_it(postgres, postgres_url, tmp_path):
    database = postgres_url.rsplit("/", 1)[1]
    assert await backends(postgres.url, database) == 0
    settings = f'database_url = "{postgres_url}"\n'  # no redis_url: the fleet's state is in the database too
    with sluice_on_protocol_worker(tmp_path / "gateway", ADMIN_KEY, settings) as (server, worker):
        worker.replies = [Reply(tokens())]
        started = await backends(postgres.url, database)
        seen = [started]
        calls = asyncio.ensure_future(burst(server.url, server.api_key))
        while not calls.done():
            seen.append(await settled_backends(postgres.url, database))
            await asyncio.sleep(0.01)
        assert set(await calls) == {200}
        seen.append(await backends(postgres.url, database))
        assert 1 <= started and max(seen) <= POOL_SIZE + LISTENERS, seen
    assert await backends(postgres.url, database) == 0  # stopped: the pool was closed
