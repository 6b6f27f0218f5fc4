"""The real gateway app served by uvicorn on loopback, on the test's own loop (SQLite auth and ledger in a
temporary data dir, or a PostgreSQL database; the model's worker address answers nothing, which no page needs),
for the dashboard tests; the admin API and the ledger within reach."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from gateway.config import Settings
from gateway.edge.app import create_app
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from testkit.servers import free_port

ADMIN_KEY = "dashboard-admin-key-0123456789abcdef"
# small: a cached-input price and a batch discount too (tests/gateway/dashboard/test_dashboard_savings.py)
PRICES = ('[pricing.models.small]\ninput = 100000\noutput = 400000\ncached_input = 25000\nbatch_discount_percent = 50\n'
          '[pricing.models.big]\ninput = 3000000\noutput = 15000000\n')


@dataclass
class ServedGateway:
    url: str
    app: object

    async def admin(self, method: str, path: str, **body) -> dict:
        """The admin API (async: the server runs on this test's loop)."""
        async with httpx.AsyncClient(base_url=self.url, timeout=30) as client:
            response = await client.request(method, path, json=body or None,
                                            headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert response.status_code < 300, response.text
        return response.json()

    async def owned_team(self, team: str, owner: str, key: str) -> tuple[str, str, dict]:
        """A new team, a new user who owns it, and that owner's personal key named `key`: (team id, user id,
        the key as created)."""
        team_id = (await self.admin("POST", "/admin/teams", name=team))["id"]
        user_id = (await self.admin("POST", "/admin/users", name=owner))["id"]
        await self.admin("PUT", f"/admin/teams/{team_id}/members/{user_id}", role="owner")
        return team_id, user_id, await self.admin("POST", "/admin/keys", name=key, team_id=team_id, user_id=user_id)

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
async def served_gateway(settings: Settings) -> AsyncIterator[ServedGateway]:
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
        yield ServedGateway(f"http://127.0.0.1:{settings.port}", app)
    finally:
        server.should_exit = True
        await task
