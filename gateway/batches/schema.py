"""The batch tables (package `batches`, its own schema versions): uploaded and produced files, batches, and one
row per batch line, which is what the runners of a fleet claim and where each line's result is kept; uploads in
progress. On PostgreSQL without a bucket, file bodies too (bodies.py)."""

from __future__ import annotations

from storage import Migration, Schema

SCHEMA = Schema("batches", [
    Migration(1, "files, batches and their lines", [
        """CREATE TABLE IF NOT EXISTS batch_files (
            id TEXT PRIMARY KEY, team_id TEXT NOT NULL, purpose TEXT NOT NULL, filename TEXT NOT NULL,
            bytes BIGINT NOT NULL, created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION)""",
        "CREATE INDEX IF NOT EXISTS batch_files_team ON batch_files (team_id, created_at)",
        """CREATE TABLE IF NOT EXISTS batches (
            id TEXT PRIMARY KEY, team_id TEXT NOT NULL, api TEXT NOT NULL, endpoint TEXT NOT NULL,
            input_file_id TEXT, status TEXT NOT NULL, principal TEXT NOT NULL, metadata TEXT,
            errors TEXT, created_at DOUBLE PRECISION NOT NULL, expires_at DOUBLE PRECISION NOT NULL,
            in_progress_at DOUBLE PRECISION, finalizing_at DOUBLE PRECISION, completed_at DOUBLE PRECISION,
            failed_at DOUBLE PRECISION, expired_at DOUBLE PRECISION, cancelling_at DOUBLE PRECISION,
            cancelled_at DOUBLE PRECISION, output_file_id TEXT, error_file_id TEXT,
            total INTEGER NOT NULL DEFAULT 0, model TEXT NOT NULL DEFAULT '',
            enqueued_tokens BIGINT NOT NULL DEFAULT 0)""",
        "CREATE INDEX IF NOT EXISTS batches_team ON batches (team_id, api, created_at)",
        "CREATE INDEX IF NOT EXISTS batches_status ON batches (status)",
        """CREATE TABLE IF NOT EXISTS batch_lines (
            batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL, body TEXT NOT NULL,
            state TEXT NOT NULL, owner TEXT, lease_until DOUBLE PRECISION, status_code INTEGER,
            result TEXT, prompt_tokens BIGINT NOT NULL DEFAULT 0, completion_tokens BIGINT NOT NULL DEFAULT 0,
            PRIMARY KEY (batch_id, idx))""",
        "CREATE INDEX IF NOT EXISTS batch_lines_state ON batch_lines (batch_id, state, idx)",
    ]),
    # a fleet's gateways share the database, not a disk: there a file's body is kept in chunks beside its row
    Migration(2, "file bodies in the database (PostgreSQL)", {"sqlite": [], "postgres": [
        """CREATE TABLE IF NOT EXISTS batch_file_bodies (
            file_id TEXT NOT NULL, seq INTEGER NOT NULL, data BYTEA NOT NULL, PRIMARY KEY (file_id, seq))"""]}),
    # an upload streams in as this row; it becomes a file (its batch_files row) only once its body is whole
    Migration(3, "uploads in progress", [
        """CREATE TABLE IF NOT EXISTS batch_file_uploads (
            file_id TEXT PRIMARY KEY, team_id TEXT NOT NULL, started_at DOUBLE PRECISION NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS batch_file_uploads_team ON batch_file_uploads (team_id, started_at)",
    ]),
])
