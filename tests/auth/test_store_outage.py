"""The database goes away: keys seen before keep authenticating from their last answer (nothing can be revoked
while it is away either), for at most `outage_grace` seconds; a key never seen gets 503 store_unavailable; once
the database is back, fresh answers (a revocation included) apply again."""

from __future__ import annotations

import asyncio
import time

import pytest

from auth import AuthService
from auth.admin import Actor
from common.errors import StoreUnavailable
from testkit.servers import restarted_at_exit, take_down
from tests.auth.helpers import PEPPER

OUTAGE_GRACE_S = 5.0  # more than stopping PostgreSQL takes on a loaded machine (it comes out of the grace)


async def test_known_keys_outlive_a_database_outage(postgres, postgres_url):
    service = await AuthService.open(postgres_url, PEPPER, cache_ttl=0.05, outage_grace=OUTAGE_GRACE_S)
    try:
        boot = await service.bootstrap(None)
        known = f"Bearer {boot.first_key}"
        principal = await service.authenticate(known, None, "client")
        answered = time.monotonic()  # the last answers were read before this
        with restarted_at_exit(postgres):
            await asyncio.to_thread(take_down, postgres)
            await asyncio.sleep(0.1)  # past the cache's freshness: the store is asked, and fails
            assert await service.authenticate(known, None, "client") == principal
            with pytest.raises(StoreUnavailable):  # never seen: nothing to trust
                await service.authenticate(f"Bearer {boot.admin_key}", None, "client")
            await asyncio.sleep(max(0.0, answered + OUTAGE_GRACE_S - time.monotonic()) + 0.1)
            with pytest.raises(StoreUnavailable):  # the last answer is too old now
                await service.authenticate(known, None, "client")
            await asyncio.to_thread(postgres.start)
        await service.admin.revoke_key(Actor(id="test", source="test"), principal.key_id)
        await asyncio.sleep(0.1)
        with pytest.raises(Exception, match="revoked"):
            await service.authenticate(known, None, "client")
    finally:
        await service.close()
