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
    Migration(4, "accounts: e-mail sign-in, one-time links, sign-in throttle; sessions of a user or a key", [
        """CREATE TABLE accounts (
            user_id TEXT PRIMARY KEY REFERENCES users(id), email TEXT NOT NULL UNIQUE, password_hash TEXT,
            created_at DOUBLE PRECISION NOT NULL)""",
        # one-time links (sign-in, password reset, team invitation) by the SHA-256 of their token
        """CREATE TABLE email_links (
            token_hash TEXT PRIMARY KEY, purpose TEXT NOT NULL, email TEXT NOT NULL,
            team_id TEXT REFERENCES teams(id), role TEXT, created_by TEXT NOT NULL,
            created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL, used_at DOUBLE PRECISION)""",
        "CREATE INDEX email_links_team ON email_links(team_id, purpose)",
        """CREATE TABLE sign_in_failures (subject TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX sign_in_failures_subject ON sign_in_failures(subject, at)",
        # a session now belongs to a key (API-key sign-in) or to a user (an account): key_id becomes nullable
        """CREATE TABLE dashboard_sessions_4 (
            id_hash TEXT PRIMARY KEY, key_id TEXT REFERENCES api_keys(id), user_id TEXT REFERENCES users(id),
            is_admin INTEGER NOT NULL DEFAULT 0, created_at DOUBLE PRECISION NOT NULL,
            seen_at DOUBLE PRECISION NOT NULL, client TEXT NOT NULL DEFAULT '', agent TEXT NOT NULL DEFAULT '',
            CHECK (key_id IS NOT NULL OR user_id IS NOT NULL))""",
        """INSERT INTO dashboard_sessions_4 (id_hash, key_id, is_admin, created_at, seen_at)
            SELECT id_hash, key_id, is_admin, created_at, seen_at FROM dashboard_sessions""",
        "DROP TABLE dashboard_sessions",
        "ALTER TABLE dashboard_sessions_4 RENAME TO dashboard_sessions",
        "CREATE INDEX dashboard_sessions_key ON dashboard_sessions(key_id)",
        "CREATE INDEX dashboard_sessions_user ON dashboard_sessions(user_id)",
    ]),
    Migration(5, "bounded records: ended keys swept by when they ended; audit entries counted per team", [
        "CREATE INDEX api_keys_revoked ON api_keys(revoked_at)",
        "CREATE INDEX api_keys_expires ON api_keys(expires_at)",
        # the team whose daily budget an entry counts against (auth/bounds.py); NULL: the operator's, and before
        "ALTER TABLE audit_log ADD COLUMN counted_team TEXT",
        "CREATE INDEX audit_log_counted_team ON audit_log(counted_team, at)",
    ]),
]

SCHEMA = Schema("auth", MIGRATIONS, legacy_table="auth_schema_migrations")
