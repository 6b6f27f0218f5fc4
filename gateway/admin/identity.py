"""The /admin router: users, teams, members, keys and the audit log. Every route needs an admin key (the
`require_admin` guard, after the app's `ApiKeyAuthentication`); bodies are read by the shared JSON step
(`common.json_body`) and checked against their struct; errors are `AuthError` / `RequestError`, which the
app renders in the OpenAI envelope."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Router, delete, get, patch, post, put
from litestar.datastructures import State
from litestar.di import Provide

from auth.admin import Actor
from auth.models import (
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
from auth.paging import PageOut, parse_cursor, parse_limit
from auth.service import AuthService
from common.json_body import read_json, read_optional_json
from gateway.authentication.headers import body_as, client_address
from gateway.authentication.middleware import auth_service, require_admin
from gateway.serving.outbound import OutboundRule, check_limits


class ListOut(msgspec.Struct):
    data: list[Any]


def outbound_rule(state: State) -> OutboundRule:
    """Where a spend budget's alerts may go (`[budget_alerts]`, gateway/serving/outbound.py); an app without the
    gateway's services (the identity API alone) allows public https hosts only."""
    services = state.get("services")
    return OutboundRule.of(services.settings.budget_alerts) if services is not None else OutboundRule()


def actor_of(request: Request, auth: AuthService) -> Actor:
    return Actor(id=request.user.key_id, source=client_address(request, auth.clients))


@post("/users", status_code=201)
async def create_user(auth: AuthService, actor: Actor, payload: Any) -> UserOut:
    return await auth.admin.create_user(actor, body_as(payload, CreateUser))


@get("/users")
async def list_users(auth: AuthService, limit: str | None = None, cursor: str | None = None) -> PageOut:
    return await auth.admin.users_page(parse_limit(limit), parse_cursor("users", cursor))


@post("/teams", status_code=201)
async def create_team(auth: AuthService, actor: Actor, outbound: OutboundRule, payload: Any) -> TeamOut:
    body = body_as(payload, CreateTeam)
    await check_limits(body.limits, outbound, operator=True)
    return await auth.admin.create_team(actor, body)


@get("/teams")
async def list_teams(auth: AuthService, limit: str | None = None, cursor: str | None = None) -> PageOut:
    return await auth.admin.teams_page(parse_limit(limit), parse_cursor("teams", cursor))


@patch("/teams/{team_id:str}")
async def update_team(auth: AuthService, actor: Actor, outbound: OutboundRule, payload: Any, team_id: str) -> TeamOut:
    body = body_as(payload, PatchTeam)
    await check_limits(body.limits or None, outbound, operator=True)
    return await auth.admin.update_team(actor, team_id, body)


@get("/teams/{team_id:str}/members")
async def list_members(auth: AuthService, team_id: str) -> ListOut:
    return ListOut(await auth.admin.list_members(team_id))


@put("/teams/{team_id:str}/members/{user_id:str}")
async def put_member(auth: AuthService, actor: Actor, payload: Any, team_id: str, user_id: str) -> MemberOut:
    return await auth.admin.put_member(actor, team_id, user_id, body_as(payload, PutMember))


@delete("/teams/{team_id:str}/members/{user_id:str}", status_code=200)
async def delete_member(auth: AuthService, actor: Actor, team_id: str, user_id: str) -> dict:
    await auth.admin.delete_member(actor, team_id, user_id)
    return {"team_id": team_id, "user_id": user_id, "deleted": True}


@post("/keys", status_code=201)
async def create_key(auth: AuthService, actor: Actor, outbound: OutboundRule, payload: Any) -> KeyCreated:
    body = body_as(payload, CreateKey)
    await check_limits(body.limits, outbound, operator=True)
    return await auth.admin.create_key(actor, body)


@get("/keys")
async def list_keys(auth: AuthService, team_id: str | None = None, limit: str | None = None,
                    cursor: str | None = None) -> PageOut:
    return await auth.admin.keys_page(team_id, parse_limit(limit), parse_cursor("keys", cursor))


@delete("/keys/{key_id:str}", status_code=200)
async def revoke_key(auth: AuthService, actor: Actor, key_id: str) -> KeyOut:
    return await auth.admin.revoke_key(actor, key_id)


@post("/keys/{key_id:str}/rotate", status_code=201, dependencies={"payload": Provide(read_optional_json)})
async def rotate_key(auth: AuthService, actor: Actor, payload: Any, key_id: str) -> KeyCreated:
    return await auth.admin.rotate_key(actor, key_id, body_as(payload, RotateKey))


@get("/audit")
async def audit(auth: AuthService, limit: str | None = None, cursor: str | None = None,
                before: str | None = None) -> PageOut:
    """Newest first; `before` (an entry id) is the older spelling of a cursor and still works."""
    position = parse_cursor("audit", cursor)
    return await auth.admin.audit_page(parse_limit(limit), position[1] if position else before)


def admin_router() -> Router:
    return Router(
        path="/admin",
        route_handlers=[create_user, list_users, create_team, list_teams, update_team, list_members, put_member,
                        delete_member, create_key, list_keys, revoke_key, rotate_key, audit],
        guards=[require_admin],
        dependencies={"auth": Provide(auth_service, sync_to_thread=False),
                      "actor": Provide(actor_of, sync_to_thread=False), "payload": Provide(read_json),
                      "outbound": Provide(outbound_rule, sync_to_thread=False)},
    )
