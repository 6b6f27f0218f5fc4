"""The real gateway app in process (its lifespan, SQLite auth and ledger in tmp_path) in front of a worker that
plays the protocol from a script (tests/fixtures/protocol_worker.py)."""

from __future__ import annotations

import pytest
from litestar.testing import AsyncTestClient

from common.protocol import ModelConfig
from gateway.app import create_app
from gateway.config import Settings
from tests.fixtures.protocol_worker import MODEL, protocol_worker

ADMIN_KEY = "gateway-tests-admin-key-0123456789abcdef"


@pytest.fixture
def worker():
    with protocol_worker() as scripted:
        yield scripted


@pytest.fixture
async def gateway(worker, tmp_path, monkeypatch):
    """An AsyncTestClient on the app, with `.key_headers` (a key of the default team) and `.admin_headers`."""
    monkeypatch.setenv("SLUICE_ADMIN_KEY", ADMIN_KEY)
    settings = Settings(data_dir=str(tmp_path), models=[ModelConfig(name=MODEL, urls=[worker.url])])
    app = create_app(settings, supervise=False)
    async with AsyncTestClient(app=app, timeout=30) as client:
        client.admin_headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        teams = (await client.get("/admin/teams", headers=client.admin_headers)).json()["data"]
        team_id = next(team["id"] for team in teams if team["name"] == "default")
        created = await client.post("/admin/keys", json={"name": "tests", "team_id": team_id},
                                    headers=client.admin_headers)
        assert created.status_code == 201, created.text
        client.key_headers = {"authorization": f"Bearer {created.json()['key']}"}
        client.app_under_test = app
        yield client
