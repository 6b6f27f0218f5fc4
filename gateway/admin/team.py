"""The /v1/team router: what a team's own keys may see and do, by role (README: Roles).

- every key of the team (member, owner, service key): `GET /v1/team` (the team, its limits, the caller's role),
  `GET /v1/team/limits` (rate limits and budgets in money with spend so far, thresholds reached, reset times)
- owners (and admin keys, for the team they name): the team's members, and its keys (auth/team_keys.py, under
  the rule of auth/policy.py): list every key that can act in the team, create and rotate service keys, revoke
  them, edit them (`PATCH /keys/{id}`: rename; limits within the team's own and the model allow-list of a
  service key), block a member's personal key in this team (`POST|DELETE /keys/{id}/block`), set the team's
  budgets within the operator's ceiling (`PUT /budgets`, auth/budget_rules.py) and its alerts on error rate and
  latency (`PUT|DELETE /alerts`). Membership, the team's rate
  limits and ceiling, personal and admin keys stay with the operator (`/admin`).

The team is the billed team of the request (`X-Team-Id`, else the key's team), as everywhere."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Router, delete, get, patch, post, put
from litestar.di import Provide

from auth.admin import Actor
from auth.models import (
    BlockKey,
    CreateTeamKey,
    EditKey,
    HealthAlerts,
    KeyCreated,
    KeyOut,
    Limits,
    RotateKey,
    TeamBudgets,
    TeamKeyOut,
)
from auth.paging import PageOut, parse_cursor, parse_limit
from auth.policy import Manager, role_in
from auth.service import AuthService, Principal
from common.json_body import read_json, read_optional_json
from gateway.admin.identity import ListOut, actor_of, outbound_rule
from gateway.authentication.headers import body_as
from gateway.authentication.middleware import auth_service, require_owner
from gateway.serving.outbound import OutboundRule, check_health_alerts, check_limits
from gateway.serving.services import Services
from gateway.serving.spending import LimitsView, limits_view, scoped_limits


class TeamView(msgspec.Struct):
    id: str
    limits: Limits | None  # alert webhook_url and emails (budget, health) only for those who manage its keys
    role: str  # "owner", "member", "service" (a service key) or "admin"
    alerts_to_webhook: bool = False  # the team's spend budget alerts a webhook (shown to every key of the team)
    alerts_to_emails: int = 0  # ... and this many e-mail addresses


def _without_destinations(limits: Limits | None) -> Limits | None:
    """The limits with every alert's destinations left out (the spend budget's and the health alerts'): where
    alerts go is the owners' to know (a Slack-style webhook URL is a secret)."""
    if limits is None:
        return None
    budget, health = limits.spend_budget, limits.health_alerts
    return msgspec.structs.replace(
        limits, spend_budget=None if budget is None else msgspec.structs.replace(budget, webhook_url=None, emails=[]),
        health_alerts=None if health is None else msgspec.structs.replace(health, webhook_url=None, emails=[]))


@get("/")
async def my_team(request: Request) -> TeamView:
    principal: Principal = request.user
    limits = principal.team_limits
    budget = limits.spend_budget if limits is not None else None
    shown = limits if principal.manager.manages_keys else _without_destinations(limits)
    return TeamView(principal.team_id, shown, role_in(principal.is_admin, principal.role),
                    budget is not None and budget.webhook_url is not None, len(budget.emails) if budget else 0)


@get("/limits")
async def my_limits(request: Request, services: Services) -> LimitsView:
    """Every key of the team: the team's (and the caller's key's) rate limits and budgets, spend so far, the
    thresholds reached and when each resets."""
    return await limits_view(services.spending, request.user.team_id, scoped_limits(request.user))


@get("/members", guards=[require_owner])
async def members(request: Request, auth: AuthService) -> ListOut:
    return ListOut(await auth.admin.list_members(request.user.team_id))


def manager_of(request: Request) -> Manager:
    principal: Principal = request.user
    return principal.manager


@get("/keys", guards=[require_owner])
async def keys(request: Request, auth: AuthService, manager: Manager, limit: str | None = None,
               cursor: str | None = None) -> PageOut:
    """Paged as the admin lists (`limit` 1-1,000, default 100; `cursor`: the previous page's `next_cursor`)."""
    return await auth.team_keys.page(manager, request.user.team_id, parse_limit(limit),
                                     parse_cursor("team_keys", cursor))


@post("/keys", status_code=201, guards=[require_owner])
async def create_key(request: Request, auth: AuthService, actor: Actor, manager: Manager, outbound: OutboundRule,
                     payload: Any) -> KeyCreated:
    body = body_as(payload, CreateTeamKey)
    await check_limits(body.limits, outbound, operator=request.user.is_admin)
    return await auth.team_keys.create(actor, manager, request.user.team_id, body)


@put("/budgets", guards=[require_owner])
async def set_budgets(request: Request, auth: AuthService, actor: Actor, manager: Manager, outbound: OutboundRule,
                      payload: Any) -> Limits:
    """The team's budget in money and monthly token budget, set by its owners within the operator's ceiling
    (auth/budget_rules.py); the team's limits after the change."""
    body = body_as(payload, TeamBudgets)
    await check_limits(Limits(spend_budget=body.spend_budget), outbound, operator=request.user.is_admin)
    return await auth.team_budgets.set(actor, manager, request.user.team_id, body)


@put("/alerts", guards=[require_owner])
async def set_alerts(request: Request, auth: AuthService, actor: Actor, manager: Manager, outbound: OutboundRule,
                     payload: Any) -> Limits:
    """The team's alerts on its error rate and latency (gateway/serving/health_alerts.py). The team's limits after
    the change."""
    alerts = body_as(payload, HealthAlerts)
    await check_health_alerts(alerts, outbound, operator=request.user.is_admin)
    return await auth.team_budgets.set_alerts(actor, manager, request.user.team_id, alerts)


@delete("/alerts", status_code=200, guards=[require_owner])
async def clear_alerts(request: Request, auth: AuthService, actor: Actor, manager: Manager) -> Limits:
    return await auth.team_budgets.set_alerts(actor, manager, request.user.team_id, None)


@delete("/keys/{key_id:str}", status_code=200, guards=[require_owner])
async def revoke_key(request: Request, auth: AuthService, actor: Actor, manager: Manager, key_id: str) -> KeyOut:
    return await auth.team_keys.revoke(actor, manager, request.user.team_id, key_id)


@patch("/keys/{key_id:str}", guards=[require_owner])
async def edit_key(request: Request, auth: AuthService, actor: Actor, manager: Manager, outbound: OutboundRule,
                   payload: Any, key_id: str) -> KeyOut:
    """Rename a key, set its limits or model allow-list (auth/policy.py: `edit` and the grants rule)."""
    body = body_as(payload, EditKey)
    if body.limits is not msgspec.UNSET:
        await check_limits(body.limits, outbound, operator=request.user.is_admin)
    return await auth.team_keys.edit(actor, manager, request.user.team_id, key_id, body)


@post("/keys/{key_id:str}/rotate", status_code=201, guards=[require_owner],
      dependencies={"payload": Provide(read_optional_json)})
async def rotate_key(request: Request, auth: AuthService, actor: Actor, manager: Manager, payload: Any,
                     key_id: str) -> KeyCreated:
    return await auth.team_keys.rotate(actor, manager, request.user.team_id, key_id, body_as(payload, RotateKey))


@post("/keys/{key_id:str}/block", status_code=200, guards=[require_owner],
      dependencies={"payload": Provide(read_optional_json)})
async def block_key(request: Request, auth: AuthService, actor: Actor, manager: Manager, payload: Any,
                    key_id: str) -> TeamKeyOut:
    body = body_as(payload, BlockKey)
    return await auth.team_keys.block(actor, manager, request.user.team_id, key_id, blocked=True, reason=body.reason)


@delete("/keys/{key_id:str}/block", status_code=200, guards=[require_owner])
async def unblock_key(request: Request, auth: AuthService, actor: Actor, manager: Manager, key_id: str) -> TeamKeyOut:
    return await auth.team_keys.block(actor, manager, request.user.team_id, key_id, blocked=False)


def team_router() -> Router:
    return Router(
        path="/v1/team",
        route_handlers=[my_team, my_limits, set_budgets, set_alerts, clear_alerts, members, keys, create_key,
                        edit_key, revoke_key, rotate_key, block_key, unblock_key],
        dependencies={"auth": Provide(auth_service, sync_to_thread=False),
                      "actor": Provide(actor_of, sync_to_thread=False),
                      "manager": Provide(manager_of, sync_to_thread=False), "payload": Provide(read_json),
                      "outbound": Provide(outbound_rule, sync_to_thread=False)},
    )
