"""The real gateway app in process (its lifespan, SQLite auth and ledger in tmp_path) in front of a worker that
plays the protocol from a script (tests/fixtures/protocol_worker.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from litestar.testing import AsyncTestClient

from gateway.config import Settings
from gateway.edge.app import create_app
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from tests.fixtures.protocol_worker import MODEL, protocol_worker

ADMIN_KEY = "gateway-tests-admin-key-0123456789abcdef"
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN_KEY}"}


async def new_key(client: AsyncTestClient, **fields) -> dict[str, str]:
    """The headers of a new key of the default team (`fields`: limits, models...)."""
    teams = (await client.get("/admin/teams", headers=ADMIN_HEADERS)).json()["data"]
    team_id = next(team["id"] for team in teams if team["name"] == "default")
    created = await client.post("/admin/keys", json={"name": "tests", "team_id": team_id, **fields},
                                headers=ADMIN_HEADERS)
    assert created.status_code == 201, created.text
    return {"authorization": f"Bearer {created.json()['key']}"}


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[AsyncTestClient]:
    """The app on `settings`, with `.key_headers` (a key of the default team) and `.admin_headers`.
    Needs `admin_key=ADMIN_KEY` in the settings."""
    async with AsyncTestClient(app=create_app(settings, supervise=False), timeout=30) as client:
        client.admin_headers = ADMIN_HEADERS
        client.key_headers = await new_key(client)
        yield client


@pytest.fixture
def worker():
    with protocol_worker() as scripted:
        yield scripted


@pytest.fixture
def gateway_settings(worker, tmp_path) -> Settings:
    model = EndpointSpec(name=MODEL, provisioner=StaticProvisioning(urls=[worker.url]))
    return Settings(data_dir=str(tmp_path), models=[model], admin_key=ADMIN_KEY)


@pytest.fixture
async def gateway(gateway_settings):
    async with serving(gateway_settings) as client:
        yield client
