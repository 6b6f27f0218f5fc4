"""The usage API over HTTP in tests: the billing routers in a Litestar app on the test's loop, rendered
as the gateway renders them, with callers resolved from fixed bearer tokens."""

from __future__ import annotations

from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx
from litestar import Litestar
from litestar.connection import ASGIConnection
from litestar.di import Provide
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult

from auth import AuthError
from gateway.admin.usage import admin_usage_router, usage_router
from gateway.authentication.middleware import require_admin
from gateway.serving.dialect import DEFAULT


@dataclass
class Principal:
    team_id: str
    key_id: str
    is_admin: bool = False


PRINCIPALS = {"Bearer a": Principal("team-a", "key-a"), "Bearer b": Principal("team-b", "key-b"),
              "Bearer root": Principal("ops", "key-root", is_admin=True)}


class StandInAuthentication(AbstractAuthenticationMiddleware):
    """Sets `request.user` as the gateway's API-key middleware does, from a fixed table (the usage API is
    tested end to end through the real gateway in tests/e2e)."""

    async def authenticate_request(self, connection: ASGIConnection) -> AuthenticationResult:
        principal = PRINCIPALS.get(connection.headers.get("authorization", ""))
        if principal is None:
            raise AuthError.invalid_key()
        return AuthenticationResult(user=principal, auth=principal.key_id)


def auth(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def ts(text: str) -> float:
    """An ISO time without an offset, read as UTC."""
    moment = datetime.fromisoformat(text)
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


@asynccontextmanager
async def usage_client(ledger):
    app = Litestar(route_handlers=[usage_router(), admin_usage_router(guards=[require_admin])],
                   middleware=[StandInAuthentication], exception_handlers=DEFAULT.exception_handlers(),
                   dependencies={"ledger": Provide(lambda: ledger, sync_to_thread=False)})
    # httpx's ASGI transport runs the app on this test's loop, where the database pool lives
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        yield client
