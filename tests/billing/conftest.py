"""Every ledger test runs against both stores: a fresh SQLite file, or a fresh PostgreSQL database
created on the session's server. S3 is moto's server, on loopback."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.records import Price
from testkit.databases import create_database, drop_database
from testkit.servers import free_port

PRICES = {"small": Price(100_000, 400_000), "big": Price(3_000_000, 15_000_000), "default": Price(1_000, 2_000)}


@pytest.fixture(params=["sqlite", "postgres"])
async def database_url(request, tmp_path: Path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'billing.db'}"
        return
    server = request.getfixturevalue("postgres")
    url = await create_database(server.url, "billing")
    yield url
    # hundreds of leftover databases made the shared server's shutdown take minutes
    await drop_database(server.url, url)


@pytest.fixture
def wal_dir(tmp_path: Path) -> Path:
    return tmp_path / "wal"


@pytest.fixture
def pricing() -> PricingTable:
    return PricingTable.static(PRICES)


@pytest.fixture
async def ledger(database_url: str, wal_dir: Path, pricing: PricingTable):
    led = await Ledger.open(database_url, wal_dir, pricing)
    yield led
    await led.close()


@pytest.fixture(scope="session")
def s3_endpoint():
    """A real S3 API (moto's server) on a free loopback port, with throwaway credentials."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3(s3_endpoint, monkeypatch):
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    return boto3.client("s3", endpoint_url=s3_endpoint)
