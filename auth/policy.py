"""Who may do what: the one module of rules that authentication (auth/service.py), the team API
(`/v1/team`, gateway/admin/team.py) and the dashboard (gateway/dashboard/) all apply, the key rules through
auth/team_keys.py, so that none of them can become a side door.

Which teams a key reaches (`reaches`): an admin key every team, a service key its own, a personal key every team
its user belongs to, except where the team's owners blocked it. Its role there (`role_in`): admin, service, or
the user's membership role. Owners (and the operator) manage the team's keys (`manages_keys`).

Every authorization decision is one of this module's functions; the routes, pages and layers that need one call it
(tests/auth/test_policy_is_the_only_owner.py fails on a role, admin or team comparison anywhere else in gateway/
or auth/): which user a key acts for (`acting_user`) and which keys are a team's (`in_team_keys`), the operator's
powers (`uses_admin_api`, `sees_every_team`, `capped`, `named_as_operator`), who sees a private endpoint
(`sees_endpoint`) and a key whole (`sees_key_whole`), who reads batches (`reads_batches`) and who sets a key's
grants (`sets_grants`).

A personal key acts in every team its user belongs to, so handing its secret to an owner of one team made that
owner a member (or owner) of the user's other teams. Hence:

- A key's clear value goes only to whoever the key already speaks for: the team's owners for a service key of
  the team, the key's own user for a personal key, and the operator (an admin key) for any key. So owners create
  and rotate the team's service keys and rotate their own personal key; personal keys are created by the
  operator (`/admin/keys`), who decides which user holds which key.
- An owner's power ends at the team: they revoke the team's service keys (and their own personal key); another
  user's personal key they may only block *in this team* (auth/team_keys.py), which leaves that user's other
  teams untouched.
- Admin keys are the operator's: owners never see or touch them.
- Editing a key (`edit`: its name, limits, model allow-list) follows rotate: the team's service keys and the
  owner's own personal key. A personal key's grants (limits, models) are the operator's, so an owner only renames
  it; a service key's limits never exceed the team's own, which only the operator sets (`grants_refusal`).
"""

from __future__ import annotations

from typing import Literal

import msgspec

from auth.budget_rules import key_budgets_refusal
from auth.errors import AuthError
from auth.models import KeyRecord, Limits

Action = Literal["create", "rotate", "revoke", "block", "unblock", "edit"]
KEY_ACTIONS: tuple[Action, ...] = ("rotate", "revoke", "block", "unblock", "edit")
ADMIN, SERVICE, OWNER, MEMBER = "admin", "service", "owner", "member"
BATCH_READERS = (OWNER, MEMBER)  # the dashboard's Batches page: a team's people, not its service keys


def acting_user(key: KeyRecord) -> str | None:
    """The user a key acts for: a personal key's; None for a service key and for an admin key (the operator's,
    whatever user it names)."""
    return None if key.is_admin else key.user_id


def reaches(key: KeyRecord, team_id: str, member_role: str | None, blocked: bool) -> bool:
    """Whether `key` may act in team `team_id`, given its user's role there (None: not a member, or no user) and
    whether the team's owners blocked it there."""
    if key.is_admin:
        return True
    if key.user_id is None:
        return team_id == key.team_id  # a service key belongs to one team
    return member_role is not None and not blocked


def role_in(is_admin: bool, member_role: str | None) -> str:
    """The role a key acts with in a team it reaches, as `GET /v1/team` and the dashboard show it: "admin",
    the user's role ("owner", "member"), or "service" (a service key)."""
    return ADMIN if is_admin else member_role or SERVICE


def in_team_keys(key: KeyRecord, team_id: str, member_role: str | None) -> bool:
    """Whether `key` is among the keys team `team_id`'s owners see and act on: the team's service keys and its
    members' personal keys (`member_role`: the key's user's role there), never an admin key."""
    if key.is_admin:
        return False
    return key.team_id == team_id or (key.user_id is not None and member_role is not None)


def capped(is_admin: bool) -> bool:
    """Whether a team's caps hold the caller (the number of its keys, the operator's budget ceiling): everyone's
    but the operator's, who sets them."""
    return not is_admin


def named_as_operator(key_is_admin: bool, viewer_is_operator: bool) -> bool:
    """An admin key's name is the platform's: a team's viewers see OPERATOR in its place, the operator the name."""
    return key_is_admin and not viewer_is_operator


def is_owner(member_role: str | None) -> bool:
    """Whether a membership role is an owner's (the members page counts them: a team keeps one)."""
    return member_role == OWNER


def reads_batches(role: str | None) -> bool:
    """The dashboard's Batches page: the team's owners and members (a service or admin key signs in to none)."""
    return role in BATCH_READERS


def uses_admin_api(is_admin: bool) -> bool:
    """`/admin/*` and the operator's other powers (GET /metrics without the metrics token, the health routes'
    detail, the dashboard's ranking across teams): the admin key's, the operator's, alone."""
    return is_admin


def sees_every_team(is_admin: bool) -> bool:
    """The dashboard across teams: the ranking of teams, every team's keys, a key created in any team. Everyone
    else sees and acts in the team on screen only."""
    return is_admin


def sees_endpoint(endpoint_team_id: str | None, *, is_admin: bool, team_id: str | None) -> bool:
    """A public endpoint (no team) is everyone's; a private one its team's and the operator's. A caller without
    a key (`team_id` None, not admin) sees the public ones only."""
    return endpoint_team_id is None or is_admin or (team_id is not None and team_id == endpoint_team_id)


def sees_key_whole(is_admin: bool, key_team_id: str, team_id: str) -> bool:
    """A key as the owners of team `team_id` see it: whole when made in that team; a member's personal key made
    in another team without that team's grants and use (the team API's rule, auth/views.py); the operator sees
    every key whole."""
    return is_admin or key_team_id == team_id


def shows_own_key_limits(is_admin: bool) -> bool:
    """A team's limits page shows the signed-in key's own limits too, except the admin key's: those are not the
    team's business."""
    return not is_admin


def sets_grants(is_admin: bool, key_user_id: str | None) -> bool:
    """Who sets a key's limits and models: the operator on any key, an owner on the team's service keys only (a
    personal key's grants are the operator's)."""
    return is_admin or key_user_id is None


def manages_keys(is_admin: bool, member_role: str | None) -> bool:
    """Owners manage their team's keys (and its members list); the operator manages every key."""
    return is_admin or is_owner(member_role)


class Manager(msgspec.Struct, frozen=True):
    """Who acts on a team's keys: their key's user (None: a service or admin key), whether it is an admin key,
    and their role in the team acted on."""

    user_id: str | None
    is_admin: bool
    role: str | None

    @property
    def manages_keys(self) -> bool:
        return manages_keys(self.is_admin, self.role)


NOT_AN_OWNER = "Managing the team needs a key of one of its owners (or the admin key)."


def check_manages(manager: Manager) -> None:
    """Managing a team (its keys, its members list): its owners and the operator."""
    if not manager.manages_keys:
        raise AuthError.denied(NOT_AN_OWNER)


def refusal(manager: Manager, action: Action, key_user_id: str | None) -> str | None:
    """Why `manager` may not do `action` to a key of user `key_user_id` (None: a service key) that can act in the
    team, or None when they may. `create` asks about the key to be created."""
    if not manager.manages_keys:
        return NOT_AN_OWNER
    if action in ("block", "unblock"):
        return None if key_user_id is not None else "Only a personal key is blocked in a team; revoke a service key."
    if manager.is_admin or key_user_id is None or key_user_id == manager.user_id:
        return None  # the operator; the team's own service keys; the caller's own personal key
    if action == "create":
        return "An owner creates the team's service keys; a personal key is created by the operator for its user."
    return (f"Only a personal key's own user (or the operator) may {action} it: it also acts in the user's other "
            "teams. Block it in this team instead.")


LIMIT_FIELDS = ("rpm", "tpm", "max_concurrency", "monthly_token_budget")


def grants_refusal(manager: Manager, key_user_id: str | None, team_limits: Limits | None,
                   limits: Limits | None) -> tuple[str, str] | None:
    """(field, why) when `manager` may not give a key of user `key_user_id` new limits or models: an owner sets
    them on service keys only, each limit at most the team's own (the operator's cap), its budgets at most the
    team's ceiling (auth/budget_rules.py). None when allowed."""
    if manager.is_admin:
        return None
    if not sets_grants(manager.is_admin, key_user_id):
        return "limits", "A personal key's limits and models are set by the operator; an owner only renames it."
    for name in LIMIT_FIELDS:
        value = getattr(limits, name) if limits is not None else None
        cap = getattr(team_limits, name) if team_limits is not None else None
        if value is not None and cap is not None and value > cap:
            return name, f"{name} may be at most the team's own limit, {cap:,}."
    return key_budgets_refusal(team_limits.ceiling if team_limits is not None else None, limits)


def check(manager: Manager, action: Action, key_user_id: str | None) -> None:
    """Raise 403 (`permission_denied`, saying why) unless `manager` may do `action`."""
    reason = refusal(manager, action, key_user_id)
    if reason is not None:
        raise AuthError.denied(reason)


def allowed_actions(manager: Manager, key: KeyRecord, *, live: bool, blocked: bool | None) -> tuple[Action, ...]:
    """What `manager` may do to `key` now (the dashboard offers exactly these). `blocked`: whether the key is
    blocked in the team on screen; None when no one team is on screen (the operator's list of every key)."""
    offered: list[Action] = ["rotate"] if live and not key.replaced_by else []
    offered += ["revoke", "edit"] if live else []
    if blocked is not None and (live or blocked):
        offered.append("unblock" if blocked else "block")
    return tuple(action for action in offered if refusal(manager, action, key.user_id) is None)
