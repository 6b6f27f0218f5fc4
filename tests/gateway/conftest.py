"""The real gateway app in process (tests/gateway/app_client.py) in front of a worker that plays the protocol
from a script (testkit/protocol_worker.py)."""

from __future__ import annotations

import pytest

from common.protocol import ModelConfig
from gateway.config import Settings
from testkit.protocol_worker import MODEL, protocol_worker
from tests.gateway.app_client import ADMIN_KEY, app_client


@pytest.fixture
def worker():
    with protocol_worker() as scripted:
        yield scripted


@pytest.fixture
def gateway_settings(worker, tmp_path, monkeypatch) -> Settings:
    monkeypatch.setenv("SLUICE_ADMIN_KEY", ADMIN_KEY)
    return Settings(data_dir=str(tmp_path), models=[ModelConfig(name=MODEL, urls=[worker.url])])


@pytest.fixture
async def gateway_app(gateway_settings):
    """The app on the protocol worker, as an AsyncTestClient (see app_client)."""
    async with app_client(gateway_settings) as client:
        yield client
