"""Clear keys appear once, in the creation response: never in logs, the database or later /admin responses."""

from __future__ import annotations

import hashlib
import hmac
import logging
from pathlib import Path

import asyncpg
import pytest

from auth import AuthError, AuthService
from tests.auth.helpers import PEPPER, bearer, make_key


async def _database_text(store_url: str) -> bytes:
    if store_url.startswith("sqlite"):
        path = Path(store_url[len("sqlite://"):])
        return b"".join(p.read_bytes() for p in path.parent.glob(path.name + "*"))  # db, -wal, -shm
    conn = await asyncpg.connect(store_url)
    try:
        tables = ["users", "teams", "memberships", "api_keys", "audit_log", "auth_settings"]
        rows = [await conn.fetch(f"SELECT * FROM {t}") for t in tables]
    finally:
        await conn.close()
    return repr(rows).encode()


async def test_secrets_do_not_leak(client, store_url, capfd, caplog):
    caplog.set_level(logging.DEBUG)
    created = await make_key(client, team_id=client.boot.default_team_id)
    rotated = (await client.post(f"/admin/keys/{created['id']}/rotate", json={"grace_seconds": 60},
                                 headers=client.admin_headers)).json()
    clear_keys = [client.boot.admin_key, client.boot.first_key, created["key"], rotated["key"]]
    for key in clear_keys:
        assert (await client.get("/v1/whoami", headers=bearer(key))).status_code == 200
        wrong = key[:-1] + ("a" if key[-1] != "a" else "b")  # failed attempts are logged too
        assert (await client.get("/v1/whoami", headers=bearer(wrong))).status_code == 401
    later = [await client.get(path, headers=client.admin_headers)
             for path in ("/admin/keys", "/admin/audit", "/admin/teams", "/admin/users")]
    out, err = capfd.readouterr()
    logs = out + err + caplog.text
    database = await _database_text(store_url)
    assert "auth.failed" in logs and created["id"] in logs  # the logs do mention the key id
    for key in clear_keys:
        secret = key.rsplit("-", 1)[1]
        assert secret not in logs
        assert secret.encode() not in database
        for response in later:
            assert secret not in response.text
            assert "secret_hash" not in response.text


async def test_keys_are_stored_as_hmac_with_the_server_pepper(store_url, service):
    boot = await service.bootstrap(None)
    key_id = boot.first_key.split("-")[2]
    row = await service.store.db.fetchone("SELECT secret_hash FROM api_keys WHERE id = ?", (key_id,))
    assert row[0] == hmac.new(PEPPER, boot.first_key.encode(), hashlib.sha256).hexdigest()
    other = await AuthService.open(store_url, PEPPER[::-1])  # the same database, another pepper
    try:
        with pytest.raises(AuthError) as info:
            await other.authenticate(f"Bearer {boot.first_key}", None, "c")
        assert info.value.status == 401
    finally:
        await other.close()
