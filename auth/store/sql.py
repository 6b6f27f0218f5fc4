"""The auth store: every query the package runs, over either database driver."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

import msgspec

from auth.models import AuditRecord, KeyRecord, Limits, MemberRecord, Role, SessionRecord, TeamRecord, UserRecord
from auth.store.account_sql import AccountQueries
from storage import Database, Executor

_KEY_COLUMNS = ("id, secret_hash, name, user_id, team_id, is_admin, models, limits, expires_at, "
                "revoked_at, created_at, last_used_at, replaced_by")
_limits_decoder = msgspec.json.Decoder(Limits | None)
_models_decoder = msgspec.json.Decoder(tuple[str, ...])
_encode = msgspec.json.encode


def _limits(raw: str | None) -> Limits | None:
    return _limits_decoder.decode(raw) if raw else None


def _limits_text(limits: Limits | None) -> str | None:
    return _encode(limits).decode() if limits is not None else None


def _key(row: tuple[Any, ...]) -> KeyRecord:
    return KeyRecord(id=row[0], secret_hash=row[1], name=row[2], user_id=row[3], team_id=row[4],
                     is_admin=bool(row[5]), models=_models_decoder.decode(row[6]), limits=_limits(row[7]),
                     expires_at=row[8], revoked_at=row[9], created_at=row[10], last_used_at=row[11],
                     replaced_by=row[12])


def _in_order(conditions: list[str], params: list[Any], after: tuple[float, str] | None, limit: int | None) -> str:
    """WHERE (the conditions, and after `after` in (created_at, id) order), ORDER BY and LIMIT of a listing;
    its parameters are appended to `params`."""
    if after is not None:
        conditions.append("(created_at > ? OR (created_at = ? AND id > ?))")
        params += [after[0], after[0], after[1]]
    where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
    if limit is None:
        return f"{where} ORDER BY created_at, id"
    params.append(limit)
    return f"{where} ORDER BY created_at, id LIMIT ?"


_SESSION_COLUMNS = "id_hash, key_id, is_admin, created_at, seen_at, user_id, client, agent"


def _session(row: tuple[Any, ...]) -> SessionRecord:
    return SessionRecord(row[0], row[1], bool(row[2]), row[3], row[4], row[5], row[6], row[7])


def _audit(row: tuple[Any, ...]) -> AuditRecord:
    entry_id, at, actor, source, action, target, detail = row
    return AuditRecord(entry_id, at, actor, source, action, target, detail=msgspec.json.decode(detail))


def _team(row: tuple[Any, ...]) -> TeamRecord:
    return TeamRecord(id=row[0], name=row[1], limits=_limits(row[2]), created_at=row[3])


class Store(AccountQueries):
    """Queries bound to an executor: the database itself, or one open transaction."""

    def __init__(self, db: Database, executor: Executor | None = None) -> None:
        self.db = db
        self._x: Executor = executor or db

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Store]:
        """Identity writes (bootstrap, keys against a team's cap, memberships against the last owner) read before
        they write and are rare: they run one at a time under one lock, which no other write of the database
        (the ledger, stored responses, the fleet) waits for."""
        async with self.db.transaction(lock="identity") as tx:
            yield Store(self.db, tx)

    async def close(self) -> None:
        await self.db.close()

    # --- users ---
    async def insert_user(self, user: UserRecord) -> None:
        await self._x.execute("INSERT INTO users (id, name, created_at) VALUES (?, ?, ?)",
                              (user.id, user.name, user.created_at))

    async def get_user(self, user_id: str) -> UserRecord | None:
        row = await self._x.fetchone("SELECT id, name, created_at FROM users WHERE id = ?", (user_id,))
        return UserRecord(*row) if row else None

    async def list_users(self, limit: int | None = None, after: tuple[float, str] | None = None) -> list[UserRecord]:
        params: list[Any] = []
        rows = await self._x.fetchall(f"SELECT id, name, created_at FROM users{_in_order([], params, after, limit)}",
                                      tuple(params))
        return [UserRecord(*row) for row in rows]

    # --- teams ---
    async def insert_team(self, team: TeamRecord) -> None:
        await self._x.execute("INSERT INTO teams (id, name, limits, created_at) VALUES (?, ?, ?, ?)",
                              (team.id, team.name, _limits_text(team.limits), team.created_at))

    async def get_team(self, team_id: str) -> TeamRecord | None:
        row = await self._x.fetchone("SELECT id, name, limits, created_at FROM teams WHERE id = ?", (team_id,))
        return _team(row) if row else None

    async def get_team_by_name(self, name: str) -> TeamRecord | None:
        row = await self._x.fetchone("SELECT id, name, limits, created_at FROM teams WHERE name = ?", (name,))
        return _team(row) if row else None

    async def list_teams(self, limit: int | None = None, after: tuple[float, str] | None = None) -> list[TeamRecord]:
        params: list[Any] = []
        rows = await self._x.fetchall(
            f"SELECT id, name, limits, created_at FROM teams{_in_order([], params, after, limit)}", tuple(params))
        return [_team(row) for row in rows]

    async def update_team(self, team: TeamRecord) -> None:
        await self._x.execute("UPDATE teams SET name = ?, limits = ? WHERE id = ?",
                              (team.name, _limits_text(team.limits), team.id))

    # --- memberships ---
    async def upsert_member(self, member: MemberRecord) -> None:
        await self._x.execute(
            "INSERT INTO memberships (team_id, user_id, role, created_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (team_id, user_id) DO UPDATE SET role = excluded.role",
            (member.team_id, member.user_id, member.role, member.created_at))

    async def delete_member(self, team_id: str, user_id: str) -> bool:
        row = await self._x.fetchone("DELETE FROM memberships WHERE team_id = ? AND user_id = ? RETURNING role",
                                     (team_id, user_id))
        return row is not None

    async def get_role(self, team_id: str, user_id: str) -> Role | None:
        row = await self._x.fetchone("SELECT role FROM memberships WHERE team_id = ? AND user_id = ?",
                                     (team_id, user_id))
        return row[0] if row else None

    async def list_members(self, team_id: str) -> list[MemberRecord]:
        rows = await self._x.fetchall("SELECT team_id, user_id, role, created_at FROM memberships "
                                      "WHERE team_id = ? ORDER BY created_at, user_id", (team_id,))
        return [MemberRecord(*row) for row in rows]

    async def teams_of(self, user_id: str) -> list[str]:
        rows = await self._x.fetchall("SELECT team_id FROM memberships WHERE user_id = ? ORDER BY team_id",
                                      (user_id,))
        return [row[0] for row in rows]

    # --- keys ---
    async def insert_key(self, key: KeyRecord) -> None:
        await self._x.execute(
            f"INSERT INTO api_keys ({_KEY_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key.id, key.secret_hash, key.name, key.user_id, key.team_id, int(key.is_admin),
             _encode(list(key.models)).decode(), _limits_text(key.limits), key.expires_at, key.revoked_at,
             key.created_at, key.last_used_at, key.replaced_by))

    async def get_key(self, key_id: str) -> KeyRecord | None:
        row = await self._x.fetchone(f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE id = ?", (key_id,))
        return _key(row) if row else None

    async def list_keys(self, team_id: str | None = None, limit: int | None = None,
                        after: tuple[float, str] | None = None) -> list[KeyRecord]:
        conditions, params = (["team_id = ?"], [team_id]) if team_id is not None else ([], [])
        order = _in_order(conditions, params, after, limit)
        rows = await self._x.fetchall(f"SELECT {_KEY_COLUMNS} FROM api_keys{order}", tuple(params))
        return [_key(row) for row in rows]

    async def list_team_keys(self, team_id: str, limit: int | None = None,
                             after: tuple[float, str] | None = None) -> list[KeyRecord]:
        """Every key but admin keys that belongs to or can act in `team_id`: its service keys, the keys whose
        default team it is, and the personal keys of its members (a personal key acts in all its user's teams)."""
        conditions = ["is_admin = 0",
                      "(team_id = ? OR user_id IN (SELECT user_id FROM memberships WHERE team_id = ?))"]
        params: list[Any] = [team_id, team_id]
        order = _in_order(conditions, params, after, limit)
        rows = await self._x.fetchall(f"SELECT {_KEY_COLUMNS} FROM api_keys{order}", tuple(params))
        return [_key(row) for row in rows]

    async def count_live_keys(self, team_id: str, at: float) -> int:
        """The keys made in `team_id` that are neither revoked nor expired at `at` (the cap on a team's keys)."""
        row = await self._x.fetchone("SELECT COUNT(*) FROM api_keys WHERE team_id = ? AND revoked_at IS NULL "
                                     "AND (expires_at IS NULL OR expires_at > ?)", (team_id, at))
        return int(row[0]) if row else 0  # COUNT(*) always answers one row

    async def revoke_key(self, key_id: str, at: float) -> bool:
        """True when this call revoked it (False: no such key, or revoked already)."""
        row = await self._x.fetchone("UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL "
                                     "RETURNING id", (at, key_id))
        return row is not None

    async def edit_key(self, key_id: str, name: str, models: tuple[str, ...], limits: Limits | None) -> None:
        await self._x.execute("UPDATE api_keys SET name = ?, models = ?, limits = ? WHERE id = ?",
                              (name, _encode(list(models)).decode(), _limits_text(limits), key_id))

    async def retire_key(self, key_id: str, expires_at: float, replaced_by: str) -> None:
        await self._x.execute("UPDATE api_keys SET expires_at = ?, replaced_by = ? WHERE id = ?",
                              (expires_at, replaced_by, key_id))

    async def touch_keys(self, used: Iterable[tuple[str, float]]) -> None:
        rows = [(at, key_id) for key_id, at in used]
        if rows:
            await self._x.executemany("UPDATE api_keys SET last_used_at = ? WHERE id = ?", rows)

    # --- ended keys' records (auth/bounds.py): counted per team, swept after their retention ---
    async def count_key_records(self, team_id: str) -> int:
        """The records of keys made in `team_id`, live and ended, admin keys excepted."""
        row = await self._x.fetchone("SELECT COUNT(*) FROM api_keys WHERE team_id = ? AND is_admin = 0", (team_id,))
        return int(row[0]) if row else 0

    async def first_key_end(self, team_id: str, at: float) -> float | None:
        """When the first of the team's ended keys (revoked, or expired by `at`) ended; None when none has."""
        row = await self._x.fetchone(
            "SELECT MIN(CASE WHEN revoked_at IS NOT NULL AND (expires_at IS NULL OR revoked_at < expires_at) "
            "THEN revoked_at ELSE expires_at END) FROM api_keys WHERE team_id = ? AND is_admin = 0 "
            "AND (revoked_at IS NOT NULL OR expires_at <= ?)", (team_id, at))
        return float(row[0]) if row and row[0] is not None else None

    async def ended_keys(self, before: float, team_id: str | None, limit: int) -> list[str]:
        """Up to `limit` ids of keys (of `team_id`; None: of any team) revoked or expired before `before`, admin
        keys excepted."""
        team = " AND team_id = ?" if team_id is not None else ""
        params: tuple[Any, ...] = (before, before, *((team_id,) if team_id is not None else ()), limit)
        rows = await self._x.fetchall("SELECT id FROM api_keys WHERE (revoked_at < ? OR expires_at < ?) "
                                      f"AND is_admin = 0{team} LIMIT ?", params)
        return [row[0] for row in rows]

    async def delete_keys(self, key_ids: list[str]) -> None:
        """The keys' records with what refers to them (their sessions, their blocks)."""
        if not key_ids:
            return
        marks = ", ".join("?" * len(key_ids))
        for table in ("dashboard_sessions", "key_blocks"):
            await self._x.execute(f"DELETE FROM {table} WHERE key_id IN ({marks})", tuple(key_ids))
        await self._x.execute(f"DELETE FROM api_keys WHERE id IN ({marks})", tuple(key_ids))

    # --- per-team blocks of personal keys ---
    async def block_key(self, team_id: str, key_id: str, at: float) -> bool:
        """True when this call blocked it (False: it already was)."""
        row = await self._x.fetchone("INSERT INTO key_blocks (team_id, key_id, blocked_at) VALUES (?, ?, ?) "
                                     "ON CONFLICT (team_id, key_id) DO NOTHING RETURNING key_id", (team_id, key_id, at))
        return row is not None

    async def unblock_key(self, team_id: str, key_id: str) -> bool:
        row = await self._x.fetchone("DELETE FROM key_blocks WHERE team_id = ? AND key_id = ? RETURNING key_id",
                                     (team_id, key_id))
        return row is not None

    async def is_blocked(self, team_id: str, key_id: str) -> bool:
        return await self._x.fetchone("SELECT 1 FROM key_blocks WHERE team_id = ? AND key_id = ?",
                                      (team_id, key_id)) is not None

    async def blocked_keys(self, team_id: str) -> list[str]:
        rows = await self._x.fetchall("SELECT key_id FROM key_blocks WHERE team_id = ? ORDER BY key_id", (team_id,))
        return [row[0] for row in rows]

    async def blocked_teams(self, key_id: str) -> list[str]:
        rows = await self._x.fetchall("SELECT team_id FROM key_blocks WHERE key_id = ? ORDER BY team_id", (key_id,))
        return [row[0] for row in rows]

    async def blocks_of(self, key_ids: list[str]) -> dict[str, list[str]]:
        """The teams each of `key_ids` is blocked in (keys blocked nowhere are left out)."""
        if not key_ids:
            return {}
        marks = ", ".join("?" * len(key_ids))
        rows = await self._x.fetchall(f"SELECT key_id, team_id FROM key_blocks WHERE key_id IN ({marks}) "
                                      "ORDER BY key_id, team_id", tuple(key_ids))
        found: dict[str, list[str]] = {}
        for key_id, team_id in rows:
            found.setdefault(key_id, []).append(team_id)
        return found

    async def copy_blocks(self, from_key: str, to_key: str, at: float) -> None:
        """A rotated key's successor stays blocked where it was (a rotation is no way out of a block)."""
        await self._x.execute("INSERT INTO key_blocks (team_id, key_id, blocked_at) SELECT team_id, ?, ? "
                              "FROM key_blocks WHERE key_id = ? ON CONFLICT (team_id, key_id) DO NOTHING",
                              (to_key, at, from_key))

    # --- audit ---
    async def insert_audit(self, entry: AuditRecord, counted_team: str | None = None) -> None:
        """`counted_team`: the team whose daily budget of entries this one counts against (auth/bounds.py)."""
        await self._x.execute(
            "INSERT INTO audit_log (id, at, actor, source, action, target, detail, counted_team) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (entry.id, entry.at, entry.actor, entry.source, entry.action, entry.target,
             _encode(entry.detail).decode(), counted_team))

    async def count_team_audit(self, team_id: str, since: float) -> tuple[int, float | None]:
        """How many entries counted against `team_id` were written after `since`, and the oldest one's time."""
        row = await self._x.fetchone("SELECT COUNT(*), MIN(at) FROM audit_log WHERE counted_team = ? AND at > ?",
                                     (team_id, since))
        return (int(row[0]), row[1]) if row else (0, None)

    async def delete_audit_before(self, id_prefix: str) -> None:
        """The entries written before the time `id_prefix` stands for (auth/bounds.py audit_id_prefix)."""
        await self._x.execute("DELETE FROM audit_log WHERE id < ?", (id_prefix,))

    async def list_audit(self, limit: int, before: str | None = None) -> list[AuditRecord]:
        columns = "id, at, actor, source, action, target, detail"
        if before is None:
            rows = await self._x.fetchall(f"SELECT {columns} FROM audit_log ORDER BY id DESC LIMIT ?", (limit,))
        else:
            rows = await self._x.fetchall(f"SELECT {columns} FROM audit_log WHERE id < ? ORDER BY id DESC LIMIT ?",
                                          (before, limit))
        return [_audit(row) for row in rows]

    async def list_team_audit(self, team_id: str, limit: int, before: str | None = None) -> list[AuditRecord]:
        """Newest first, the entries that name `team_id`: as their target, a member of it, or in their detail;
        never one about an admin key (the operator's, though admin keys live in the `default` team)."""
        escaped = team_id.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        params: list[Any] = [team_id, f"{escaped}/%", f'%"team_id":"{escaped}"%']
        condition = ("(target = ? OR target LIKE ? ESCAPE '\\' OR detail LIKE ? ESCAPE '\\') AND detail NOT LIKE "
                     "'%\"is_admin\":true%' AND target NOT IN (SELECT id FROM api_keys WHERE is_admin <> 0)")
        if before is not None:
            condition += " AND id < ?"
            params.append(before)
        rows = await self._x.fetchall("SELECT id, at, actor, source, action, target, detail FROM audit_log "
                                      f"WHERE {condition} ORDER BY id DESC LIMIT ?", (*params, limit))
        return [_audit(row) for row in rows]

    # --- dashboard sessions ---
    async def insert_session(self, session: SessionRecord) -> None:
        await self._x.execute(
            f"INSERT INTO dashboard_sessions ({_SESSION_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (session.id_hash, session.key_id, int(session.is_admin), session.created_at, session.seen_at,
             session.user_id, session.client, session.agent))

    async def get_session(self, id_hash: str) -> SessionRecord | None:
        row = await self._x.fetchone(f"SELECT {_SESSION_COLUMNS} FROM dashboard_sessions WHERE id_hash = ?",
                                     (id_hash,))
        return _session(row) if row else None

    async def user_sessions(self, user_id: str) -> list[SessionRecord]:
        rows = await self._x.fetchall(f"SELECT {_SESSION_COLUMNS} FROM dashboard_sessions WHERE user_id = ? "
                                      "ORDER BY created_at DESC", (user_id,))
        return [_session(row) for row in rows]

    async def touch_session(self, id_hash: str, at: float) -> None:
        await self._x.execute("UPDATE dashboard_sessions SET seen_at = ? WHERE id_hash = ?", (at, id_hash))

    async def delete_session(self, id_hash: str) -> None:
        await self._x.execute("DELETE FROM dashboard_sessions WHERE id_hash = ?", (id_hash,))

    async def delete_user_session(self, user_id: str, id_hash: str) -> bool:
        """One of the user's own sessions (another user's is never matched)."""
        row = await self._x.fetchone("DELETE FROM dashboard_sessions WHERE id_hash = ? AND user_id = ? "
                                     "RETURNING id_hash", (id_hash, user_id))
        return row is not None

    async def delete_key_sessions(self, key_id: str) -> None:
        await self._x.execute("DELETE FROM dashboard_sessions WHERE key_id = ?", (key_id,))

    async def delete_user_sessions(self, user_id: str) -> None:
        await self._x.execute("DELETE FROM dashboard_sessions WHERE user_id = ?", (user_id,))

    async def delete_sessions_before(self, seen_before: float, created_before: float) -> None:
        """The sessions idle since `seen_before` or older than `created_before` (expired either way)."""
        await self._x.execute("DELETE FROM dashboard_sessions WHERE seen_at < ? OR created_at < ?",
                              (seen_before, created_before))

    # --- settings ---
    async def claim_setting(self, name: str, value: str) -> bool:
        """Insert name=value unless present; True when this call inserted it."""
        row = await self._x.fetchone("INSERT INTO auth_settings (name, value) VALUES (?, ?) "
                                     "ON CONFLICT (name) DO NOTHING RETURNING name", (name, value))
        return row is not None

    async def get_setting(self, name: str) -> str | None:
        row = await self._x.fetchone("SELECT value FROM auth_settings WHERE name = ?", (name,))
        return row[0] if row else None
