"""The /v1/team router: what a team's own keys may see and do, by role (README: Roles).

- every key of the team (member, owner, service key): `GET /v1/team` (the team, its limits, the caller's role)
- owners (and admin keys, for the team they name): the team's members, and its keys: list, create, revoke,
  rotate. Membership, team limits and admin keys stay with the operator (`/admin`).

The team is the billed team of the request (`X-Team-Id`, else the key's team), as everywhere."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Router, delete, get, post
from litestar.di import Provide

from auth.admin import Actor
from auth.http import body_as
from auth.middleware import auth_service, require_owner
from auth.models import CreateKey, CreateTeamKey, KeyCreated, KeyOut, Limits, RotateKey
from auth.routes import ListOut, actor_of
from auth.service import AuthService, Principal
from common.json_body import read_json, read_optional_json


class TeamView(msgspec.Struct):
    id: str
    limits: Limits | None
    role: str  # "owner", "member", "service" (a service key) or "admin"


def _role(principal: Principal) -> str:
    return "admin" if principal.is_admin else principal.role or "service"


@get("/")
async def my_team(request: Request) -> TeamView:
    principal: Principal = request.user
    return TeamView(principal.team_id, principal.team_limits, _role(principal))


@get("/members", guards=[require_owner])
async def members(request: Request, auth: AuthService) -> ListOut:
    return ListOut(await auth.admin.list_members(request.user.team_id))


@get("/keys", guards=[require_owner])
async def keys(request: Request, auth: AuthService) -> ListOut:
    return ListOut([key for key in await auth.admin.list_keys(request.user.team_id) if not key.is_admin])


@post("/keys", status_code=201, guards=[require_owner])
async def create_key(request: Request, auth: AuthService, actor: Actor, payload: Any) -> KeyCreated:
    body = body_as(payload, CreateTeamKey)
    return await auth.admin.create_key(actor, CreateKey(**msgspec.structs.asdict(body), team_id=request.user.team_id))


@delete("/keys/{key_id:str}", status_code=200, guards=[require_owner])
async def revoke_key(request: Request, auth: AuthService, actor: Actor, key_id: str) -> KeyOut:
    await auth.admin.team_key(request.user.team_id, key_id)
    return await auth.admin.revoke_key(actor, key_id)


@post("/keys/{key_id:str}/rotate", status_code=201, guards=[require_owner],
      dependencies={"payload": Provide(read_optional_json)})
async def rotate_key(request: Request, auth: AuthService, actor: Actor, payload: Any, key_id: str) -> KeyCreated:
    await auth.admin.team_key(request.user.team_id, key_id)
    return await auth.admin.rotate_key(actor, key_id, body_as(payload, RotateKey))


def team_router() -> Router:
    return Router(
        path="/v1/team",
        route_handlers=[my_team, members, keys, create_key, revoke_key, rotate_key],
        dependencies={"auth": Provide(auth_service, sync_to_thread=False),
                      "actor": Provide(actor_of, sync_to_thread=False), "payload": Provide(read_json)},
    )
