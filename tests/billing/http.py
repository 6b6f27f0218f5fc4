"""The usage API over HTTP in tests: the billing routers in a Litestar app on the test's loop, with
callers resolved from fixed bearer tokens."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from litestar import Litestar
from litestar.exceptions import NotAuthorizedException

from billing.routes import admin_usage_router, usage_router


@dataclass
class Principal:
    team_id: str
    key_id: str
    is_admin: bool = False


PRINCIPALS = {"Bearer a": Principal("team-a", "key-a"), "Bearer b": Principal("team-b", "key-b"),
              "Bearer root": Principal("ops", "key-root", is_admin=True)}


async def authenticate(request):
    # stands in for the auth package's service, which the gateway adapts to this signature
    principal = PRINCIPALS.get(request.headers.get("authorization", ""))
    if principal is None:
        raise NotAuthorizedException("invalid API key")
    return principal


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def ts(text: str) -> float:
    """An ISO time without an offset, read as UTC."""
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@asynccontextmanager
async def usage_client(ledger):
    app = Litestar(route_handlers=[usage_router(ledger, authenticate), admin_usage_router(ledger, authenticate)])
    # httpx's ASGI transport runs the app on this test's loop, where the database pool lives
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        yield client
