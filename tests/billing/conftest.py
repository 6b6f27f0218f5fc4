"""Every ledger test runs against both stores: a fresh SQLite file, or a fresh PostgreSQL database
created on the session's server."""

from __future__ import annotations

import uuid
from pathlib import Path

import asyncpg
import pytest

from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.records import Price

PRICES = {"small": Price(100_000, 400_000), "big": Price(3_000_000, 15_000_000), "default": Price(1_000, 2_000)}


async def create_database(server_url: str) -> str:
    name = f"billing_{uuid.uuid4().hex[:12]}"
    con = await asyncpg.connect(server_url)
    try:
        await con.execute(f"CREATE DATABASE {name}")
    finally:
        await con.close()
    return server_url.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=["sqlite", "postgres"])
async def database_url(request, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'billing.db'}"
    server = request.getfixturevalue("postgres")
    return await create_database(server.url)


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
