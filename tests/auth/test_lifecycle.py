"""Rotation with a grace period, expiry, revocation and last-used bookkeeping."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from auth import AuthError, AuthService
from auth.admin import Actor
from auth.models import CreateKey, RotateKey
from tests.auth.helpers import PEPPER, assert_envelope, bearer, make_key

ACTOR = Actor(id="test", source="test")
GRACE_S = 3  # rotation grace and time to expiry where a test checks the key inside them, then past them


async def _status(service: AuthService, key: str) -> int | str:
    try:
        await service.authenticate(f"Bearer {key}", None, "c")
    except AuthError as exc:
        return exc.code
    return 200


async def test_rotate_over_http_gives_a_new_key_and_both_work_during_grace(client):
    old = await make_key(client, team_id=client.boot.default_team_id, models=["m1"], limits={"rpm": 9})
    response = await client.post(f"/admin/keys/{old['id']}/rotate", json={"grace_seconds": 3600},
                                 headers=client.admin_headers)
    assert response.status_code == 201
    new = response.json()
    assert new["key"] != old["key"] and new["replaces"] == old["id"]
    assert new["models"] == ["m1"] and new["limits"] == {"rpm": 9} and new["team_id"] == old["team_id"]
    for key in (old["key"], new["key"]):
        assert (await client.get("/v1/whoami", headers=bearer(key))).status_code == 200
    listed = {k["id"]: k for k in (await client.get("/admin/keys", headers=client.admin_headers)).json()["data"]}
    assert listed[old["id"]]["replaced_by"] == new["id"] and listed[old["id"]]["expires_at"] is not None


async def test_rotation_grace_ends(service):
    team_id = (await service.bootstrap(None)).default_team_id
    old = await service.admin.create_key(ACTOR, CreateKey(name="k", team_id=team_id))
    # a grace that the checks inside it outlast on no machine (a loaded one took a second over them)
    new = await service.admin.rotate_key(ACTOR, old.id, RotateKey(grace_seconds=GRACE_S))
    assert await _status(service, old.key) == 200 and await _status(service, new.key) == 200
    await asyncio.sleep(GRACE_S + 0.1)
    assert await _status(service, old.key) == "expired_api_key"
    assert await _status(service, new.key) == 200


async def test_rotation_without_grace_retires_the_old_key_at_once(service):
    team_id = (await service.bootstrap(None)).default_team_id
    old = await service.admin.create_key(ACTOR, CreateKey(name="k", team_id=team_id))
    assert await _status(service, old.key) == 200  # cached now
    new = await service.admin.rotate_key(ACTOR, old.id, RotateKey())
    assert await _status(service, old.key) == "expired_api_key"
    assert await _status(service, new.key) == 200


async def test_expiry(service):
    team_id = (await service.bootstrap(None)).default_team_id
    soon = (datetime.now(UTC) + timedelta(seconds=GRACE_S)).isoformat()
    key = await service.admin.create_key(ACTOR, CreateKey(name="k", team_id=team_id, expires_at=soon))
    assert await _status(service, key.key) == 200
    await asyncio.sleep(GRACE_S + 0.1)
    assert await _status(service, key.key) == "expired_api_key"


async def test_expired_and_revoked_keys_are_401_over_http(client):
    key = await make_key(client, team_id=client.boot.default_team_id)
    await client.delete(f"/admin/keys/{key['id']}", headers=client.admin_headers)
    error = assert_envelope(await client.get("/v1/whoami", headers=bearer(key["key"])), 401, "revoked_api_key")
    assert error["type"] == "authentication_error"


async def test_last_used_is_written_in_batches(store_url):
    service = await AuthService.open(store_url, PEPPER, touch_interval=3600)
    try:
        boot = await service.bootstrap(None)
        for _ in range(50):
            await service.authenticate(f"Bearer {boot.first_key}", None, "c")
        keys = {k.name: k for k in await service.admin.list_keys()}
        assert keys["default"].last_used_at is None  # nothing written per request
        await service.flush_usage()
        keys = {k.name: k for k in await service.admin.list_keys()}
        assert keys["default"].last_used_at is not None and keys["bootstrap-admin"].last_used_at is None
    finally:
        await service.close()


async def test_last_used_flushes_on_its_own_after_the_interval(store_url):
    service = await AuthService.open(store_url, PEPPER, touch_interval=0.05)
    try:
        boot = await service.bootstrap(None)
        await asyncio.sleep(0.06)
        await service.authenticate(f"Bearer {boot.first_key}", None, "c")
        for _ in range(3000):  # a minute at most: it ends at the flush
            keys = {k.name: k for k in await service.admin.list_keys()}
            if keys["default"].last_used_at is not None:
                break
            await asyncio.sleep(0.02)
        assert keys["default"].last_used_at is not None
    finally:
        await service.close()


async def test_revoke_is_idempotent_and_keeps_first_time(service):
    team_id = (await service.bootstrap(None)).default_team_id
    key = await service.admin.create_key(ACTOR, CreateKey(name="k", team_id=team_id))
    first = await service.admin.revoke_key(ACTOR, key.id)
    second = await service.admin.revoke_key(ACTOR, key.id)
    assert first.revoked_at == second.revoked_at
    with pytest.raises(AuthError):
        await service.authenticate(f"Bearer {key.key}", None, "c")
