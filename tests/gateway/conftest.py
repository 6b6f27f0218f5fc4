"""The real gateway app in process (tests/gateway/app_client.py) in front of a worker that plays the protocol
from a script (testkit/protocol_worker.py)."""

from __future__ import annotations

import pytest

from gateway.config import Settings
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from testkit.protocol_worker import MODEL, protocol_worker
from tests.gateway.app_client import ADMIN_KEY, app_client


@pytest.fixture
def worker():
    with protocol_worker() as scripted:
        yield scripted


@pytest.fixture
def gateway_settings(worker, tmp_path) -> Settings:
    model = EndpointSpec(name=MODEL, provisioner=StaticProvisioning(urls=[worker.url]))
    return Settings(data_dir=str(tmp_path), models=[model], admin_key=ADMIN_KEY)


@pytest.fixture
async def gateway_app(gateway_settings):
    """The app on the protocol worker, as an AsyncTestClient (see app_client)."""
    async with app_client(gateway_settings) as client:
        yield client
