"""Billing's tables, as numbered migrations per SQL dialect. The auth package shares the
database, so every name here is billing-owned."""

from __future__ import annotations

from billing.store.base import MIGRATIONS_TABLE, TABLE


def _usage_table(real: str, integer: str) -> str:
    return f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    request_id TEXT PRIMARY KEY,
    time {real} NOT NULL,
    day TEXT NOT NULL,
    team_id TEXT NOT NULL,
    key_id TEXT NOT NULL,
    user_id TEXT,
    model TEXT NOT NULL,
    dialect TEXT NOT NULL,
    route TEXT NOT NULL,
    prompt_tokens {integer} NOT NULL,
    completion_tokens {integer} NOT NULL,
    compute_tokens {integer} NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('ok', 'cancelled', 'error', 'rejected')),
    latency_ms {real} NOT NULL,
    ttft_ms {real},
    worker_id TEXT NOT NULL,
    input_price_micros {integer} NOT NULL,
    output_price_micros {integer} NOT NULL,
    cost_micros {integer} NOT NULL,
    recorded_at {real} NOT NULL
)"""


def _indexes() -> list[str]:
    return [f"CREATE INDEX IF NOT EXISTS {TABLE}_team_time ON {TABLE} (team_id, time)",
            f"CREATE INDEX IF NOT EXISTS {TABLE}_time ON {TABLE} (time)"]


SQLITE_MIGRATIONS: list[list[str]] = [[_usage_table("REAL", "INTEGER"), *_indexes()]]
POSTGRES_MIGRATIONS: list[list[str]] = [[_usage_table("DOUBLE PRECISION", "BIGINT"), *_indexes()]]

MIGRATIONS_DDL = (f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} "
                  "(version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)")
