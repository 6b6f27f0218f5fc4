"""The dashboard in a real browser: the real gateway app served by uvicorn on loopback (SQLite auth and
ledger in a temporary data dir; the model's worker address answers nothing, which no page needs), teams,
users and keys made through the admin API, usage recorded through the gateway's own ledger, and Debian's
Chromium driven by Playwright. Screenshots go to tests/artifacts/dashboard/ (or $SLUICE_ARTIFACTS)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import uvicorn
from playwright.async_api import async_playwright

from gateway.config import Settings
from gateway.edge.app import create_app
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from tests.fixtures.servers import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
ADMIN_KEY = "dashboard-admin-key-0123456789abcdef"
PRICES = ('[pricing.models.small]\ninput = 100000\noutput = 400000\n'
          '[pricing.models.big]\ninput = 3000000\noutput = 15000000\n')


@dataclass
class Gateway:
    url: str
    app: object

    async def admin(self, method: str, path: str, **body) -> dict:
        """The admin API (async: the server runs on this test's loop)."""
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as client:
            response = await client.request(method, path, json=body or None,
                                            headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert response.status_code < 300, response.text
        return response.json()

    @property
    def ledger(self):
        return self.app.state.services.ledger


def settings_in(folder: Path, database_url: str = "") -> Settings:
    """A gateway on SQLite in `folder` (auth and ledger), or on `database_url`; two gateways given the same
    folder (and URL) share both."""
    (folder / "prices.toml").write_text(PRICES)
    model = EndpointSpec(name="small", provisioner=StaticProvisioning(urls=[f"http://127.0.0.1:{free_port()}"]))
    return Settings(data_dir=str(folder / "data"), port=free_port(), models=[model], database_url=database_url,
                    pricing_file=str(folder / "prices.toml"), log_format="console", admin_key=ADMIN_KEY)


@contextlib.asynccontextmanager
async def serving(settings: Settings) -> AsyncIterator[Gateway]:
    """The gateway app served by uvicorn on this test's loop until the block ends."""
    app = create_app(settings, supervise=False)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=settings.port, log_level="warning",
                                           lifespan="on"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.05)
    try:
        yield Gateway(f"http://127.0.0.1:{settings.port}", app)
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def gateway(tmp_path):
    async with serving(settings_in(tmp_path)) as gateway:
        yield gateway


@contextlib.asynccontextmanager
async def chromium_page(**context_options) -> AsyncIterator:
    """A page of a fresh Chromium context (1280x900 unless told)."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = await browser.new_context(**{"viewport": {"width": 1280, "height": 900}, **context_options})
        try:
            yield await context.new_page()
        finally:
            await context.close()
            await browser.close()


@pytest.fixture
async def page():
    async with chromium_page() as page:
        yield page


@pytest.fixture(scope="session")
def artifacts() -> Path:
    folder = Path(os.environ.get("SLUICE_ARTIFACTS", "tests/artifacts")) / "dashboard"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder
