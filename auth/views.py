"""Stored records → admin API responses (never carrying a secret or a hash)."""

from __future__ import annotations

from typing import Any

from auth.clock import iso
from auth.keys import display_prefix
from auth.models import (
    AuditOut,
    AuditRecord,
    KeyCreated,
    KeyOut,
    KeyRecord,
    MemberOut,
    MemberRecord,
    TeamKeyOut,
    TeamOut,
    TeamRecord,
    UserOut,
    UserRecord,
)
from auth.policy import sees_key_whole


def user_out(user: UserRecord) -> UserOut:
    return UserOut(id=user.id, name=user.name, created_at=iso(user.created_at))


def team_out(team: TeamRecord) -> TeamOut:
    return TeamOut(id=team.id, name=team.name, limits=team.limits, created_at=iso(team.created_at))


def member_out(member: MemberRecord) -> MemberOut:
    return MemberOut(team_id=member.team_id, user_id=member.user_id, role=member.role,
                     created_at=iso(member.created_at))


def _key_fields(key: KeyRecord) -> dict[str, Any]:
    return dict(id=key.id, prefix=display_prefix(key.id), name=key.name, user_id=key.user_id,
                team_id=key.team_id, is_admin=key.is_admin, models=list(key.models), limits=key.limits,
                expires_at=iso(key.expires_at), revoked_at=iso(key.revoked_at), created_at=iso(key.created_at),
                last_used_at=iso(key.last_used_at), replaced_by=key.replaced_by)


def key_out(key: KeyRecord) -> KeyOut:
    return KeyOut(**_key_fields(key))


def team_key_out(key: KeyRecord, blocked: bool, team_id: str) -> TeamKeyOut:
    """A key as the owners of `team_id` see it. A member's personal key made in another team shows only what
    is this team's business (who, which key, whether it is live, its block here): not that team's id, nor the
    key's limits (a budget's webhook and e-mails), models or last use."""
    fields = _key_fields(key)
    if not sees_key_whole(False, key.team_id, team_id):
        fields.update(team_id=None, models=[], limits=None, last_used_at=None)
        return TeamKeyOut(**fields, blocked=blocked, made_here=False)
    return TeamKeyOut(**fields, blocked=blocked)


def key_created(key: KeyRecord, clear_key: str, replaces: str | None = None) -> KeyCreated:
    return KeyCreated(**_key_fields(key), key=clear_key, replaces=replaces)


def audit_out(entry: AuditRecord) -> AuditOut:
    return AuditOut(id=entry.id, at=iso(entry.at), actor=entry.actor, source=entry.source,
                    action=entry.action, target=entry.target, detail=entry.detail)
