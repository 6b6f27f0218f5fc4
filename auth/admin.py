"""Admin operations shared by the HTTP admin API and the CLI; each mutation is audited in its transaction."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import msgspec
import structlog

from auth import paging, views
from auth.bounds import RecordBounds, audit_id_prefix
from auth.budget_rules import team_only_on_key
from auth.clock import now, parse_iso
from auth.errors import RequestError
from auth.keys import KeyHasher, new_key
from auth.models import (
    AuditOut,
    AuditRecord,
    CreateKey,
    CreateTeam,
    CreateUser,
    KeyCreated,
    KeyOut,
    KeyRecord,
    Limits,
    MemberOut,
    MemberRecord,
    PatchTeam,
    PutMember,
    RotateKey,
    TeamOut,
    TeamRecord,
    UserOut,
    UserRecord,
)
from auth.paging import PageOut, Position
from auth.store import Conflict, Store

log = structlog.get_logger("auth.admin")


class Actor(msgspec.Struct, frozen=True):
    id: str  # admin key id, or "cli:<os user>", or "system"
    source: str  # client address, or "cli"


def _position(record: Any) -> Position:  # a KeyRecord, TeamRecord or UserRecord
    return record.created_at, record.id


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def _audit_id(at: float) -> str:
    # Time-ordered, so ORDER BY id is chronological (and retention deletes by id); the random tail breaks ties.
    return f"{audit_id_prefix(at)}{secrets.token_hex(4)}"


def issue_key(hasher: KeyHasher, *, name: str, team_id: str, user_id: str | None, is_admin: bool = False,
              models: tuple[str, ...] = (), limits: Limits | None = None, expires_at: float | None = None,
              clear_key: str | None = None, at: float | None = None) -> tuple[KeyRecord, str]:
    """A new key record and its clear value (generated unless given)."""
    key_id: str | None
    if clear_key is None:
        key_id, clear_key = new_key()
    else:
        key_id = hasher.key_id(clear_key)
        if key_id is None:
            raise ValueError("not a usable key")
    record = KeyRecord(id=key_id, secret_hash=hasher.digest(clear_key), name=name, user_id=user_id,
                       team_id=team_id, is_admin=is_admin, models=models, limits=limits, expires_at=expires_at,
                       revoked_at=None, created_at=now() if at is None else at)
    return record, clear_key


def _via(team_id: str | None) -> dict[str, Any]:
    return {"team_id": team_id} if team_id is not None else {}


def audit_entry(actor: Actor, action: str, target: str, detail: dict[str, Any] | None = None) -> AuditRecord:
    at = now()
    return AuditRecord(id=_audit_id(at), at=at, actor=actor.id, source=actor.source, action=action,
                       target=target, detail=detail or {})


class AdminOps:
    """`tenant=True` on a key operation: a team's owner acts (through auth/team_keys.py), whom the team's bounds
    hold (auth/bounds.py); the operator's own actions are never refused and never counted against a team."""

    def __init__(self, store: Store, hasher: KeyHasher, forget: Callable[..., None],
                 bounds: RecordBounds | None = None) -> None:
        self._store = store
        self._hasher = hasher
        self._forget = forget  # drops this process's cached entries at once; others follow within the TTL
        self.bounds = bounds or RecordBounds()

    # --- users ---
    async def create_user(self, actor: Actor, body: CreateUser) -> UserOut:
        user = UserRecord(id=new_id("usr"), name=body.name.strip(), created_at=now())
        async with self._store.transaction() as tx:
            await tx.insert_user(user)
            await self.bounds.audit(tx, audit_entry(actor, "users.create", user.id, {"name": user.name}), None)
        log.info("auth.user_created", user_id=user.id, actor=actor.id)
        return views.user_out(user)

    async def list_users(self) -> list[UserOut]:
        return [views.user_out(u) for u in await self._store.list_users()]

    async def users_page(self, limit: int, after: Position | None) -> PageOut:
        return paging.page("users", await self._store.list_users(limit + 1, after), limit, _position, views.user_out)

    # --- teams ---
    async def create_team(self, actor: Actor, body: CreateTeam) -> TeamOut:
        team = TeamRecord(id=new_id("team"), name=body.name.strip(), limits=body.limits, created_at=now())
        try:
            async with self._store.transaction() as tx:
                await tx.insert_team(team)
                await self.bounds.audit(tx, audit_entry(actor, "teams.create", team.id, {
                    "name": team.name, "limits": msgspec.to_builtins(team.limits)}), None)
        except Conflict:
            raise RequestError(409, "team_exists", f"A team named {team.name!r} already exists.", "name") from None
        return views.team_out(team)

    async def update_team(self, actor: Actor, team_id: str, body: PatchTeam) -> TeamOut:
        try:
            async with self._store.transaction() as tx:
                team = await tx.get_team(team_id)
                if team is None:
                    raise RequestError(404, "team_not_found", f"No team {team_id!r}.", "team_id")
                changes = {f: msgspec.to_builtins(getattr(body, f)) for f in ("name", "limits")
                           if getattr(body, f) is not msgspec.UNSET}
                if "name" in changes and isinstance(body.name, str):
                    team = msgspec.structs.replace(team, name=body.name.strip())
                if "limits" in changes:
                    team = msgspec.structs.replace(team, limits=body.limits)
                await tx.update_team(team)
                await self.bounds.audit(tx, audit_entry(actor, "teams.update", team_id, changes), None)
        except Conflict:
            raise RequestError(409, "team_exists", "A team with that name already exists.", "name") from None
        self._forget(team=team_id)
        return views.team_out(team)

    async def list_teams(self) -> list[TeamOut]:
        return [views.team_out(t) for t in await self._store.list_teams()]

    async def teams_page(self, limit: int, after: Position | None) -> PageOut:
        return paging.page("teams", await self._store.list_teams(limit + 1, after), limit, _position, views.team_out)

    async def list_members(self, team_id: str) -> list[MemberOut]:
        if await self._store.get_team(team_id) is None:
            raise RequestError(404, "team_not_found", f"No team {team_id!r}.", "team_id")
        return [views.member_out(m) for m in await self._store.list_members(team_id)]

    # --- memberships ---
    async def put_member(self, actor: Actor, team_id: str, user_id: str, body: PutMember) -> MemberOut:
        async with self._store.transaction() as tx:
            await self._require_team_and_user(tx, team_id, user_id)
            member = MemberRecord(team_id=team_id, user_id=user_id, role=body.role, created_at=now())
            await tx.upsert_member(member)
            await self.bounds.audit(tx, audit_entry(actor, "members.put", f"{team_id}/{user_id}",
                                                    {"role": body.role}), None)
        self._forget(team=team_id, user=user_id)
        return views.member_out(member)

    async def delete_member(self, actor: Actor, team_id: str, user_id: str) -> None:
        async with self._store.transaction() as tx:
            await self._require_team_and_user(tx, team_id, user_id)
            if not await tx.delete_member(team_id, user_id):
                raise RequestError(404, "member_not_found", f"User {user_id!r} is not in team {team_id!r}.",
                                   "user_id")
            await self.bounds.audit(tx, audit_entry(actor, "members.delete", f"{team_id}/{user_id}"), None)
        self._forget(team=team_id, user=user_id)

    @staticmethod
    async def _require_team_and_user(tx: Store, team_id: str, user_id: str) -> None:
        if await tx.get_team(team_id) is None:
            raise RequestError(404, "team_not_found", f"No team {team_id!r}.", "team_id")
        if await tx.get_user(user_id) is None:
            raise RequestError(404, "user_not_found", f"No user {user_id!r}.", "user_id")

    # --- keys ---
    async def create_key(self, actor: Actor, body: CreateKey, live_cap: int | None = None, *,
                         tenant: bool = False) -> KeyCreated:
        """`live_cap`: refuse (409) when the key's team already has that many live keys (a tenant's creation)."""
        on_key = team_only_on_key(body.limits)
        if on_key is not None:
            raise RequestError(400, "invalid_limits", on_key[1], on_key[0])
        expires_at = None
        if body.expires_at is not None:
            try:
                expires_at = parse_iso(body.expires_at)
            except ValueError:
                raise RequestError(400, "invalid_expires_at", "expires_at must be an ISO 8601 time, "
                                   "e.g. 2030-01-31T00:00:00Z.", "expires_at") from None
            if expires_at <= now():
                raise RequestError(400, "invalid_expires_at", "expires_at must be in the future.", "expires_at")
        async with self._store.transaction() as tx:
            team_id = await self._key_team(tx, body)
            at = now()
            if live_cap is not None and await tx.count_live_keys(team_id, at) >= live_cap:
                raise RequestError(409, "too_many_keys", f"This team has {live_cap} live keys, the most it may "
                                   "have (max_keys_per_team): revoke one first.", None)
            await self._make_room(tx, team_id, at, tenant)
            record, clear = issue_key(self._hasher, name=body.name.strip(), team_id=team_id, user_id=body.user_id,
                                      is_admin=body.is_admin, models=tuple(dict.fromkeys(body.models)),
                                      limits=body.limits, expires_at=expires_at, at=at)
            await tx.insert_key(record)
            await self.bounds.audit(tx, audit_entry(actor, "keys.create", record.id, {
                "name": record.name, "team_id": team_id, "user_id": body.user_id, "is_admin": body.is_admin}),
                team_id if tenant else None)
        log.info("auth.key_created", key_id=record.id, team_id=team_id, actor=actor.id)
        return views.key_created(record, clear)

    async def _make_room(self, tx: Store, team_id: str, at: float, tenant: bool) -> None:
        """Before a new key record in `team_id`: sweep ended records past their retention; a tenant's is refused
        (409) when the team still holds its cap of records."""
        await self.bounds.sweep_keys(tx, team_id, at)
        if tenant:
            await self.bounds.check_key_room(tx, team_id, at)

    @staticmethod
    async def _key_team(tx: Store, body: CreateKey) -> str:
        """The key's default team, checked: a service key's team, or a team its user belongs to."""
        if body.team_id is not None and await tx.get_team(body.team_id) is None:
            raise RequestError(400, "team_not_found", f"No team {body.team_id!r}.", "team_id")
        if body.user_id is None:
            if body.team_id is None:
                raise RequestError(400, "missing_owner", "team_id or user_id is required.", "team_id")
            return body.team_id
        if await tx.get_user(body.user_id) is None:
            raise RequestError(400, "user_not_found", f"No user {body.user_id!r}.", "user_id")
        if body.team_id is None:
            teams = await tx.teams_of(body.user_id)
            if len(teams) != 1:
                raise RequestError(400, "missing_team", f"team_id is required: user {body.user_id!r} belongs "
                                   f"to {len(teams)} teams.", "team_id")
            return teams[0]
        if await tx.get_role(body.team_id, body.user_id) is None:
            raise RequestError(400, "not_a_member", f"User {body.user_id!r} is not a member of team "
                               f"{body.team_id!r}.", "team_id")
        return body.team_id

    async def list_keys(self, team_id: str | None = None) -> list[KeyOut]:
        return [views.key_out(k) for k in await self._store.list_keys(team_id)]

    async def keys_page(self, team_id: str | None, limit: int, after: Position | None) -> PageOut:
        rows = await self._store.list_keys(team_id, limit + 1, after)
        return paging.page("keys", rows, limit, _position, views.key_out)

    async def revoke_key(self, actor: Actor, key_id: str, via_team: str | None = None, *,
                         tenant: bool = False) -> KeyOut:
        """`via_team`: the team whose owners revoked it (auth/team_keys.py), for the audit log. Idempotent: a key
        revoked already keeps its time and adds no entry. Never refused by the team's audit budget (taking power
        away must stay possible; each key is revoked once, so these entries are bounded by the keys made)."""
        async with self._store.transaction() as tx:
            revoked = await tx.revoke_key(key_id, now())
            key = await tx.get_key(key_id)
            if key is None:
                raise RequestError(404, "key_not_found", f"No key {key_id!r}.", "key_id")
            if revoked:
                await self.bounds.audit(tx, audit_entry(actor, "keys.revoke", key_id, _via(via_team)),
                                        (via_team or key.team_id) if tenant else None, refusable=False)
        self._forget(key=key_id)
        log.info("auth.key_revoked", key_id=key_id, actor=actor.id)
        return views.key_out(key)

    async def rotate_key(self, actor: Actor, key_id: str, body: RotateKey, via_team: str | None = None, *,
                         tenant: bool = False) -> KeyCreated:
        """A new key with the same grants and per-team blocks; the old one keeps working for `grace_seconds`.
        A new record: within the team's bounds like a create (a rotation loop would grow it as well)."""
        at = now()
        async with self._store.transaction() as tx:
            old = await tx.get_key(key_id)
            if old is None:
                raise RequestError(404, "key_not_found", f"No key {key_id!r}.", "key_id")
            if not old.is_live(at):
                raise RequestError(409, "key_inactive", f"Key {key_id!r} is revoked or expired.", "key_id")
            if old.replaced_by:  # in its grace period: a second rotation would fork the key's lineage
                raise RequestError(409, "key_already_replaced",
                                   f"Key {key_id!r} was already rotated; rotate its replacement {old.replaced_by!r}.",
                                   "key_id")
            await self._make_room(tx, old.team_id, at, tenant)
            new, clear = issue_key(self._hasher, name=old.name, team_id=old.team_id, user_id=old.user_id,
                                   is_admin=old.is_admin, models=old.models, limits=old.limits,
                                   expires_at=old.expires_at, at=at)
            grace_end = at + body.grace_seconds
            if old.expires_at is not None:
                grace_end = min(grace_end, old.expires_at)
            await tx.insert_key(new)
            await tx.copy_blocks(key_id, new.id, at)
            await tx.retire_key(key_id, grace_end, new.id)
            await self.bounds.audit(tx, audit_entry(actor, "keys.rotate", key_id, {
                "new_key_id": new.id, "grace_seconds": body.grace_seconds, **_via(via_team)}),
                (via_team or old.team_id) if tenant else None)
        self._forget(key=key_id)
        log.info("auth.key_rotated", key_id=key_id, new_key_id=new.id, actor=actor.id)
        return views.key_created(new, clear, replaces=key_id)

    # --- audit ---
    async def audit(self, limit: int = 100, before: str | None = None) -> list[AuditOut]:
        return (await self.audit_page(max(1, min(limit, paging.MAX_LIMIT)), before)).data

    async def team_audit_page(self, team_id: str, limit: int, before: str | None = None) -> PageOut:
        """The entries about one team (its owners' read-only view, gateway/dashboard/team_pages.py)."""
        rows = await self._store.list_team_audit(team_id, limit + 1, before)
        return paging.page("audit", rows, limit, lambda e: (0.0, e.id), views.audit_out)

    async def audit_page(self, limit: int, before: str | None = None) -> PageOut:
        """Newest first: `before` is the id of the last entry seen (a cursor's position)."""
        rows = await self._store.list_audit(limit + 1, before)
        return paging.page("audit", rows, limit, lambda e: (0.0, e.id), views.audit_out)

