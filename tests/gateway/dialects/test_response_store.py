"""The stored responses' table on both databases (SQLite, PostgreSQL): a team's quota counted in the inserting
transaction, the bound of one response, expiry for reads and the purge (gateway/dialects/responses/store.py). The
HTTP side, and the disk floor, are tests/security/test_stored_responses.py's."""

from __future__ import annotations

import asyncio
import time

import pytest

import storage
from gateway.dialects.responses.store import (
    ResponseStore,
    ResponseTooLarge,
    StoragePolicy,
    StoredResponsesQuotaExceeded,
)

POLICY = StoragePolicy(retention_s=3600, max_response_bytes=2000, team_max_bytes=3000, team_max_responses=3)


def response(number: int, text: str = "hi") -> dict:
    return {"id": f"resp_{number}", "object": "response", "output": [{"text": text}]}


async def test_quota_bound_and_expiry(store_url):
    db = await storage.open(store_url)
    try:
        store = ResponseStore(db, POLICY)
        with pytest.raises(ResponseTooLarge):
            await store.save("team_a", response(0, "x" * 2000), [])
        saved = await asyncio.gather(*(store.save("team_a", response(n), [{"role": "user", "content": "hi"}])
                                       for n in range(8)), return_exceptions=True)
        assert sum(result is None for result in saved) == 3  # concurrent saves never pass the count together
        assert all(isinstance(r, StoredResponsesQuotaExceeded) for r in saved if r is not None)
        count, used = await store.usage("team_a")
        assert count == 3 and 0 < used <= 3000
        await store.save("team_b", response(100, "y" * 1500), [])  # another team's quota is its own
        with pytest.raises(StoredResponsesQuotaExceeded, match="bytes"):
            await store.save("team_b", response(101, "y" * 1500), [])

        kept = [n for n in range(8) if await store.get("team_a", f"resp_{n}") is not None]
        assert len(kept) == 3 and await store.get("team_b", f"resp_{kept[0]}") is None  # a team sees its own
        assert await store.purge_expired() == 0
        assert await store.purge_expired(now=time.time() + 3601) == 4  # past the retention: every row goes
        assert await store.usage("team_a") == (0, 0)

        store.policy = StoragePolicy(retention_s=0.01, max_response_bytes=2000, team_max_bytes=3000,
                                     team_max_responses=3)
        await store.save("team_a", response(200), [])
        await asyncio.sleep(0.05)
        assert await store.get("team_a", "resp_200") is None  # expired: gone for reads before the sweep
        assert not await store.delete("team_a", "resp_200") and await store.usage("team_a") == (0, 0)
    finally:
        await db.close()
