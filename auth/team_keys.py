"""A team's keys as its owners (and the operator) manage them: the operations behind `/v1/team/keys` and the
dashboard's keys page. Each checks auth/policy.py first and is audited (create, rotate and revoke through
AdminOps, in its transaction; blocks here).

A team's keys are every key that can act in it, admin keys excepted: its service keys and its members' personal
keys, wherever those were created. A block (`key_blocks`) stops one personal key in one team: the
authentication path refuses it there within the cache's TTL, the user's other teams keep working, and the key's
rotations inherit it."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from auth import paging, views
from auth.admin import Actor, AdminOps, audit_entry
from auth.bounds import counted_team
from auth.budget_rules import team_only_on_key
from auth.clock import now
from auth.errors import RequestError
from auth.models import (
    CreateKey,
    CreateTeamKey,
    EditKey,
    KeyCreated,
    KeyOut,
    KeyRecord,
    Limits,
    RotateKey,
    TeamKeyOut,
)
from auth.paging import PageOut, Position
from auth.policy import (
    Action,
    Manager,
    acting_user,
    allowed_actions,
    capped,
    check,
    check_manages,
    grants_refusal,
    in_team_keys,
    sees_every_team,
)
from auth.store import Store

OWN_KEY_BLOCK = ("This is the key you are acting with: blocking it would lock you out of this team, and only the "
                 "operator could unblock it. Block it with another owner's key.")


class ListedKey(msgspec.Struct, frozen=True):
    key: KeyRecord
    blocked: bool  # blocked in the team listed (False in the operator's list of every key)
    actions: tuple[Action, ...]  # what the manager who listed it may do to it
    blocked_in: tuple[str, ...] = ()  # the operator's list of every key: the teams it is blocked in


class TeamKeys:
    def __init__(self, store: Store, admin: AdminOps, forget: Callable[..., None], max_keys: int | None = None) -> None:
        self._store = store
        self._admin = admin
        self._forget = forget
        self._max_keys = max_keys  # live keys an owner may make in one team; None: no cap

    # --- reading ---
    async def key(self, manager: Manager, team_id: str | None, key_id: str) -> KeyRecord:
        """A key that can act in `team_id` (no admin key); `team_id` None: any key, for the operator only.
        404 otherwise: the same answer for "no such key" and "not this team's"."""
        key = await self._store.get_key(key_id)
        if key is None or not (sees_every_team(manager.is_admin) if team_id is None
                               else await self._acts_in(key, team_id)):
            raise RequestError(404, "key_not_found", f"No key {key_id!r} in this team.", "key_id")
        return key

    async def _acts_in(self, key: KeyRecord, team_id: str) -> bool:
        user_id = acting_user(key)
        return in_team_keys(key, team_id, await self._store.get_role(team_id, user_id) if user_id is not None else None)

    async def listed(self, manager: Manager, team_id: str, limit: int | None = None,
                     after: Position | None = None) -> list[ListedKey]:
        """The team's keys in creation order (`limit` + `after`: a page of them), with their block in the team."""
        check_manages(manager)
        keys = await self._store.list_team_keys(team_id, limit, after)
        blocked = set(await self._store.blocked_keys(team_id))
        at = now()
        return [ListedKey(k, k.id in blocked, allowed_actions(manager, k, live=k.is_live(at), blocked=k.id in blocked))
                for k in keys]

    async def every_key(self, manager: Manager, team_id: str | None, limit: int,
                        after: Position | None) -> list[ListedKey]:
        """The operator's list: every key (of `team_id`'s default team when given), admin keys included."""
        if not sees_every_team(manager.is_admin):
            raise RequestError(404, "team_not_found", "No such team.", "team_id")
        at = now()
        keys = await self._store.list_keys(team_id, limit, after)
        blocks = await self._store.blocks_of([k.id for k in keys if k.user_id is not None])
        return [ListedKey(k, False, allowed_actions(manager, k, live=k.is_live(at), blocked=None),
                          tuple(blocks.get(k.id, ()))) for k in keys]

    async def page(self, manager: Manager, team_id: str, limit: int, after: Position | None) -> PageOut:
        """One page of the team's keys as its owners see them (`GET /v1/team/keys`), in creation order."""
        rows = await self.listed(manager, team_id, limit + 1, after)
        return paging.page("team_keys", rows, limit, lambda k: (k.key.created_at, k.key.id),
                           lambda k: views.team_key_out(k.key, k.blocked, team_id))

    # --- changes ---
    async def create(self, actor: Actor, manager: Manager, team_id: str, body: CreateTeamKey) -> KeyCreated:
        check(manager, "create", body.user_id)
        await self._check_grants(manager, team_id, body.user_id, body.limits)
        tenant = capped(manager.is_admin)
        return await self._admin.create_key(actor, CreateKey(**msgspec.structs.asdict(body), team_id=team_id),
                                            self._max_keys if tenant else None, tenant=tenant)

    async def may(self, manager: Manager, team_id: str | None, key_id: str, action: Action) -> KeyRecord:
        """The key, if `manager` may do `action` to it in `team_id` (404 when out of reach, 403 when denied):
        the check every change makes first, and what a page asks before it offers to confirm one."""
        key = await self.key(manager, team_id, key_id)
        check(manager, action, key.user_id)
        return key

    async def rotate(self, actor: Actor, manager: Manager, team_id: str | None, key_id: str,
                     body: RotateKey) -> KeyCreated:
        await self.may(manager, team_id, key_id, "rotate")
        return await self._admin.rotate_key(actor, key_id, body, via_team=team_id, tenant=capped(manager.is_admin))

    async def revoke(self, actor: Actor, manager: Manager, team_id: str | None, key_id: str) -> KeyOut:
        await self.may(manager, team_id, key_id, "revoke")
        return await self._admin.revoke_key(actor, key_id, via_team=team_id, tenant=capped(manager.is_admin))

    async def edit(self, actor: Actor, manager: Manager, team_id: str | None, key_id: str, body: EditKey) -> KeyOut:
        """Rename a key, or set its limits and model allow-list, under auth/policy.py (`edit`, then the grants
        rule: an owner's service key stays within the team's own limits); audited with what changed."""
        key = await self.may(manager, team_id, key_id, "edit")
        if not key.is_live(now()):
            raise RequestError(409, "key_inactive", f"Key {key_id!r} is revoked or expired.", "key_id")
        name = key.name if body.name is msgspec.UNSET else body.name.strip()
        models = key.models if body.models is msgspec.UNSET else tuple(dict.fromkeys(body.models))
        limits = key.limits if body.limits is msgspec.UNSET else body.limits
        changed = {field: value for field, value, old in (("name", name, key.name), ("models", list(models),
                   list(key.models)), ("limits", limits, key.limits)) if value != old}
        if "models" in changed or "limits" in changed:
            await self._check_grants(manager, key.team_id, key.user_id, limits)
        if changed:
            async with self._store.transaction() as tx:
                await tx.edit_key(key_id, name, models, limits)
                detail = {**changed, "team_id": team_id or key.team_id}
                if "limits" in detail:
                    detail["limits"] = msgspec.to_builtins(limits)
                await self._admin.bounds.audit(tx, audit_entry(actor, "keys.edit", key_id, detail),
                                               counted_team(manager, team_id or key.team_id))
            self._forget(key=key_id)
        return views.key_out(msgspec.structs.replace(key, name=name, models=models, limits=limits))

    async def _check_grants(self, manager: Manager, team_id: str | None, key_user_id: str | None,
                            limits: Limits | None) -> None:
        """403 naming the field when the grants rule (auth/policy.py) refuses these limits; 400 for a ceiling."""
        on_key = team_only_on_key(limits)
        if on_key is not None:
            raise RequestError(400, "invalid_limits", on_key[1], on_key[0])
        team = await self._store.get_team(team_id) if team_id is not None else None
        refused = grants_refusal(manager, key_user_id, team.limits if team is not None else None, limits)
        if refused is not None:
            raise RequestError(403, "permission_denied", refused[1], refused[0])

    async def block(self, actor: Actor, manager: Manager, team_id: str, key_id: str, *, blocked: bool,
                    reason: str | None = None) -> TeamKeyOut:
        """Block (or unblock) a personal key in this team only; idempotent, audited (with the owner's `reason`)
        when it changed anything. The key that asks may not block itself: it would lose the team at once, and
        only the operator could give it back."""
        key = await self.may(manager, team_id, key_id, "block" if blocked else "unblock")
        if blocked and key_id == actor.id:
            raise RequestError(409, "own_key", OWN_KEY_BLOCK, "key_id")
        async with self._store.transaction() as tx:
            changed = (await tx.block_key(team_id, key_id, now()) if blocked
                       else await tx.unblock_key(team_id, key_id))
            if changed:  # a block takes power away: never refused by the audit budget (auth/bounds.py)
                detail = {"team_id": team_id, "user_id": key.user_id, **({"reason": reason} if reason else {})}
                await self._admin.bounds.audit(tx, audit_entry(actor, "keys.block" if blocked else "keys.unblock",
                                                               key_id, detail),
                                               counted_team(manager, team_id), refusable=not blocked)
        self._forget(block=(team_id, key_id))
        return views.team_key_out(key, blocked, team_id)
