"""The /admin router: every handler needs an admin key (a router guard); errors use the JSON envelope."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import structlog
from litestar import Request, Response, Router, delete, get, patch, post, put
from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException
from litestar.handlers import BaseRouteHandler

from auth.admin import Actor
from auth.errors import AuthError, RequestError
from auth.http import client_address, decode_body, error_response, team_header
from auth.models import (
    AuditOut,
    CreateKey,
    CreateTeam,
    CreateUser,
    KeyCreated,
    KeyOut,
    MemberOut,
    PatchTeam,
    PutMember,
    RotateKey,
    TeamOut,
    UserOut,
)
from auth.service import AuthService

log = structlog.get_logger("auth.admin")


class ListOut(msgspec.Struct):
    data: list[Any]


def _auth_error(_: Request, exc: AuthError | RequestError) -> Response:
    return error_response(exc)


def _http_error(_: Request, exc: HTTPException) -> Response:
    # Litestar's own 4xx (bad path or query parameter, wrong method) in the same envelope.
    status = exc.status_code if exc.status_code < 500 else 500
    message = exc.detail if isinstance(exc.detail, str) else "Request failed."
    if exc.extra and isinstance(exc.extra, list):
        message = f"{message}: {exc.extra}"
    return error_response(RequestError(status, "invalid_request", message))


def _internal_error(_: Request, exc: Exception) -> Response:
    log.error("auth.admin_error", error=type(exc).__name__)  # the type only: messages may quote values
    return error_response(RequestError(500, "internal_error", "Internal error."))


def admin_router(service: AuthService | Callable[[], AuthService]) -> Router:
    """Pass the service, or a callable returning it when the service is opened later (in the app's lifespan)."""
    current: Callable[[], AuthService] = service if callable(service) else (lambda: service)

    class _Admin:  # resolves the service at request time, so the router can be built before it opens
        def __getattr__(self, name: str):
            return getattr(current().admin, name)

    admin = _Admin()

    async def require_admin(connection: ASGIConnection, _: BaseRouteHandler) -> None:
        client = client_address(connection)
        principal = await current().authenticate(connection.headers.get("authorization"),
                                               team_header(connection.headers), client)
        if not principal.is_admin:
            raise AuthError.denied("The admin API needs an admin key.")
        connection.state.actor = Actor(id=principal.key_id, source=client)

    def actor(request: Request) -> Actor:
        return request.state.actor

    @post("/users", status_code=201)
    async def create_user(request: Request) -> UserOut:
        return await admin.create_user(actor(request), decode_body(await request.body(), CreateUser))

    @get("/users")
    async def list_users() -> ListOut:
        return ListOut(await admin.list_users())

    @post("/teams", status_code=201)
    async def create_team(request: Request) -> TeamOut:
        return await admin.create_team(actor(request), decode_body(await request.body(), CreateTeam))

    @get("/teams")
    async def list_teams() -> ListOut:
        return ListOut(await admin.list_teams())

    @patch("/teams/{team_id:str}")
    async def update_team(request: Request, team_id: str) -> TeamOut:
        return await admin.update_team(actor(request), team_id, decode_body(await request.body(), PatchTeam))

    @get("/teams/{team_id:str}/members")
    async def list_members(team_id: str) -> ListOut:
        return ListOut(await admin.list_members(team_id))

    @put("/teams/{team_id:str}/members/{user_id:str}")
    async def put_member(request: Request, team_id: str, user_id: str) -> MemberOut:
        body = decode_body(await request.body(), PutMember)
        return await admin.put_member(actor(request), team_id, user_id, body)

    @delete("/teams/{team_id:str}/members/{user_id:str}", status_code=200)
    async def delete_member(request: Request, team_id: str, user_id: str) -> dict:
        await admin.delete_member(actor(request), team_id, user_id)
        return {"team_id": team_id, "user_id": user_id, "deleted": True}

    @post("/keys", status_code=201)
    async def create_key(request: Request) -> KeyCreated:
        return await admin.create_key(actor(request), decode_body(await request.body(), CreateKey))

    @get("/keys")
    async def list_keys(team_id: str | None = None) -> ListOut:
        return ListOut(await admin.list_keys(team_id))

    @delete("/keys/{key_id:str}", status_code=200)
    async def revoke_key(request: Request, key_id: str) -> KeyOut:
        return await admin.revoke_key(actor(request), key_id)

    @post("/keys/{key_id:str}/rotate", status_code=201)
    async def rotate_key(request: Request, key_id: str) -> KeyCreated:
        body = decode_body(await request.body(), RotateKey, empty_ok=True)
        return await admin.rotate_key(actor(request), key_id, body)

    @get("/audit")
    async def audit(limit: int = 100, before: str | None = None) -> ListOut:
        entries: list[AuditOut] = await admin.audit(limit, before)
        return ListOut(entries)

    return Router(
        path="/admin",
        route_handlers=[create_user, list_users, create_team, list_teams, update_team, list_members, put_member,
                        delete_member, create_key, list_keys, revoke_key, rotate_key, audit],
        guards=[require_admin],
        exception_handlers={AuthError: _auth_error, RequestError: _auth_error, HTTPException: _http_error,
                            Exception: _internal_error},
    )
