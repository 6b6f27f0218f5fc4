"""Versioned schema of the auth tables, applied by storage's migration runner at start, each version once.

Append new versions; never edit an applied one. The SQL is valid for SQLite and PostgreSQL.
"""

from __future__ import annotations

from storage import Migration, Schema

MIGRATIONS = [
    Migration(1, "users, teams, memberships, api keys, audit log", [
        """CREATE TABLE users (
            id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE teams (
            id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, limits TEXT,
            created_at DOUBLE PRECISION NOT NULL)""",
        """CREATE TABLE memberships (
            team_id TEXT NOT NULL REFERENCES teams(id), user_id TEXT NOT NULL REFERENCES users(id),
            role TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (team_id, user_id))""",
        "CREATE INDEX memberships_user ON memberships(user_id)",
        """CREATE TABLE api_keys (
            id TEXT PRIMARY KEY, secret_hash TEXT NOT NULL, name TEXT NOT NULL,
            user_id TEXT REFERENCES users(id), team_id TEXT NOT NULL REFERENCES teams(id),
            is_admin INTEGER NOT NULL DEFAULT 0, models TEXT NOT NULL DEFAULT '[]', limits TEXT,
            expires_at DOUBLE PRECISION, revoked_at DOUBLE PRECISION,
            created_at DOUBLE PRECISION NOT NULL, last_used_at DOUBLE PRECISION, replaced_by TEXT)""",
        "CREATE INDEX api_keys_team ON api_keys(team_id)",
        """CREATE TABLE audit_log (
            id TEXT PRIMARY KEY, at DOUBLE PRECISION NOT NULL, actor TEXT NOT NULL,
            source TEXT NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL, detail TEXT NOT NULL)""",
        "CREATE TABLE auth_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ]),
    Migration(2, "dashboard sessions", [
        """CREATE TABLE dashboard_sessions (
            id_hash TEXT PRIMARY KEY, key_id TEXT NOT NULL REFERENCES api_keys(id),
            is_admin INTEGER NOT NULL DEFAULT 0, created_at DOUBLE PRECISION NOT NULL,
            seen_at DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX dashboard_sessions_key ON dashboard_sessions(key_id)",
    ]),
    Migration(3, "per-team key blocks; keys by user (a team's keys include its members' personal keys)", [
        """CREATE TABLE key_blocks (
            team_id TEXT NOT NULL REFERENCES teams(id), key_id TEXT NOT NULL REFERENCES api_keys(id),
            blocked_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (team_id, key_id))""",
        "CREATE INDEX key_blocks_key ON key_blocks(key_id)",
        "CREATE INDEX api_keys_user ON api_keys(user_id)",
    ]),
]

SCHEMA = Schema("auth", MIGRATIONS, legacy_table="auth_schema_migrations")
