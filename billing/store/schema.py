"""Billing's tables, as numbered migrations per SQL dialect, applied by storage's migration runner. The
auth package shares the database, so every name here is billing-owned. Migrations are history: never
edit one that shipped, add the next."""

from __future__ import annotations

from billing.store import failure_rollup, latency_rollup
from billing.store.base import TABLE
from billing.store.rollups import budget_refusals_migration, savings_migration
from billing.store.rollups import migration as rollups_migration
from storage import Migration, Schema
from storage.sql_dialect import PostgresDialect, SqliteDialect

_V1_COLUMNS = """
    request_id TEXT {pk},
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
    recorded_at {real} NOT NULL"""
_V1_NAMES = ("request_id, time, day, team_id, key_id, user_id, model, dialect, route, prompt_tokens, "
             "completion_tokens, compute_tokens, status, latency_ms, ttft_ms, worker_id, input_price_micros, "
             "output_price_micros, cost_micros, recorded_at")
# schema 2: what the dashboards chart
_V2_COLUMNS = """,
    cold_start_ms {real},
    error_code TEXT,
    error_status INTEGER,
    adapter TEXT NOT NULL DEFAULT ''"""


def _v1(real: str, integer: str) -> list[str]:
    columns = _V1_COLUMNS.format(pk="PRIMARY KEY", real=real, integer=integer)
    return [f"CREATE TABLE IF NOT EXISTS {TABLE} ({columns}\n)",
            f"CREATE INDEX IF NOT EXISTS {TABLE}_team_time ON {TABLE} (team_id, time)",
            f"CREATE INDEX IF NOT EXISTS {TABLE}_time ON {TABLE} (time)"]


# SQLite: the table is rebuilt clustered on (team_id, time): a team's window is one contiguous range
# of the table's own b-tree, so a dashboard reads it without a lookup per row. request_id stays unique.
_SQLITE_V2 = [
    (f"CREATE TABLE {TABLE}_v2 ({_V1_COLUMNS.format(pk='NOT NULL', real='REAL', integer='INTEGER')}"
     f"{_V2_COLUMNS.format(real='REAL')},\n    PRIMARY KEY (team_id, time, request_id)\n) WITHOUT ROWID"),
    f"INSERT INTO {TABLE}_v2 ({_V1_NAMES}) SELECT {_V1_NAMES} FROM {TABLE}",
    f"DROP TABLE {TABLE}",
    f"ALTER TABLE {TABLE}_v2 RENAME TO {TABLE}",
    f"CREATE UNIQUE INDEX {TABLE}_request_id ON {TABLE} (request_id)",
    f"CREATE INDEX {TABLE}_time ON {TABLE} (time, request_id)",
]

# PostgreSQL keeps no clustering, so the team index carries every column a dashboard reads: its
# queries are index-only scans. Insert-only tables are vacuumed by insert count (PostgreSQL 13+);
# a low factor keeps the visibility map, which index-only scans rely on, close to the newest rows.
_DASHBOARD_COLUMNS = ("model, key_id, user_id, dialect, status, error_status, adapter, prompt_tokens, "
                      "completion_tokens, compute_tokens, cost_micros, input_price_micros, output_price_micros, "
                      "latency_ms, ttft_ms, cold_start_ms")
_POSTGRES_V2 = [
    (f"ALTER TABLE {TABLE} ADD COLUMN cold_start_ms DOUBLE PRECISION, ADD COLUMN error_code TEXT, "
     "ADD COLUMN error_status INTEGER, ADD COLUMN adapter TEXT NOT NULL DEFAULT ''"),
    f"DROP INDEX IF EXISTS {TABLE}_team_time",
    f"DROP INDEX IF EXISTS {TABLE}_time",
    f"CREATE INDEX {TABLE}_team_time ON {TABLE} (team_id, time, request_id) INCLUDE ({_DASHBOARD_COLUMNS})",
    f"CREATE INDEX {TABLE}_time ON {TABLE} (time, request_id)",
    f"ALTER TABLE {TABLE} SET (autovacuum_vacuum_insert_scale_factor = 0.01)",
]

_ALERTS = """CREATE TABLE IF NOT EXISTS budget_alerts (
    scope TEXT NOT NULL,
    period TEXT NOT NULL,
    threshold INTEGER NOT NULL,
    sent_at {real} NOT NULL,
    PRIMARY KEY (scope, period, threshold)
)"""

# schema 5: why each answer ended, in the record's fixed vocabulary (records.FINISH_REASONS, checked here too, as
# status is; written out, since a shipped migration never changes); NULL for the records before it and for requests
# refused before any answer
_FINISH_REASON = (f"ALTER TABLE {TABLE} ADD COLUMN finish_reason TEXT CHECK (finish_reason IN "
                  "('error', 'timeout', 'cancelled', 'length', 'tool_calls', 'stop_sequence', 'stop'))")

# schema 6: the caller's own X-Request-Id, so support finds a request by the id the customer has; looked up within
# a team (the dashboard's search), so the index leads with the team
_CLIENT_REQUEST_ID = [f"ALTER TABLE {TABLE} ADD COLUMN client_request_id TEXT",
                      f"CREATE INDEX {TABLE}_client_request_id ON {TABLE} (team_id, client_request_id)"]


# schema 8: cached prompt tokens and batch lines, and what each priced record saved; NULL cached-input price: a record
# from before it (its cached price was its input price). PostgreSQL's covering index gains the columns the views sum.
def _savings_columns(integer: str) -> list[str]:
    return [f"ALTER TABLE {TABLE} ADD COLUMN cached_tokens {integer} NOT NULL DEFAULT 0",
            f"ALTER TABLE {TABLE} ADD COLUMN batch_id TEXT", f"ALTER TABLE {TABLE} ADD COLUMN custom_id TEXT",
            f"ALTER TABLE {TABLE} ADD COLUMN cached_input_price_micros {integer}",
            f"ALTER TABLE {TABLE} ADD COLUMN batch_discount_percent INTEGER NOT NULL DEFAULT 0",
            f"ALTER TABLE {TABLE} ADD COLUMN cache_saved_micros {integer} NOT NULL DEFAULT 0",
            f"ALTER TABLE {TABLE} ADD COLUMN batch_saved_micros {integer} NOT NULL DEFAULT 0"]


_DASHBOARD_COLUMNS_V8 = (f"{_DASHBOARD_COLUMNS}, cached_tokens, batch_id, cached_input_price_micros, "
                         "batch_discount_percent, cache_saved_micros, batch_saved_micros")
_POSTGRES_V8 = [*_savings_columns("BIGINT"), f"DROP INDEX IF EXISTS {TABLE}_team_time",
                f"CREATE INDEX {TABLE}_team_time ON {TABLE} (team_id, time, request_id) "
                f"INCLUDE ({_DASHBOARD_COLUMNS_V8})",
                *savings_migration(PostgresDialect(), "BIGINT", "DOUBLE PRECISION")]
_SQLITE_V8 = [*_savings_columns("INTEGER"), *savings_migration(SqliteDialect(), "INTEGER", "REAL", " WITHOUT ROWID")]



# schema 9: Predicted Outputs' accepted and rejected prediction tokens, both within completion_tokens (0: a record
# without a prediction, or from before it); no view sums them yet, so the rollups and indexes stay as they were
def _prediction_columns(integer: str) -> list[str]:
    return [f"ALTER TABLE {TABLE} ADD COLUMN accepted_prediction_tokens {integer} NOT NULL DEFAULT 0",
            f"ALTER TABLE {TABLE} ADD COLUMN rejected_prediction_tokens {integer} NOT NULL DEFAULT 0"]


# schema 10: the caller's end user and its tags (JSON, keys sorted: billing/store/base.py `tags_text`), both read
# from the raw records only (no rollup keeps them); the end user looked up within a team, so its index leads with it
_END_USERS = [f"ALTER TABLE {TABLE} ADD COLUMN end_user TEXT", f"ALTER TABLE {TABLE} ADD COLUMN tags TEXT",
              f"CREATE INDEX {TABLE}_end_user ON {TABLE} (team_id, end_user, time)"]


# schema 11: whether each health alert (gateway/serving/health_alerts.py) is fired (1) or armed (0) fleet-wide, and
# the time of the judgement that set it: a gateway changes it only with a later judgement, and sends the alert only
# when its own judgement fired it, so a crossing alerts once whichever gateways judge it
_HEALTH_STATES = """CREATE TABLE health_alert_states (
    scope TEXT NOT NULL,
    measure TEXT NOT NULL,
    fired INTEGER NOT NULL,
    changed_at {real} NOT NULL,
    PRIMARY KEY (scope, measure)
)"""


SCHEMA = Schema("billing", [
    Migration(1, "usage records", {"sqlite": _v1("REAL", "INTEGER"), "postgres": _v1("DOUBLE PRECISION", "BIGINT")}),
    Migration(2, "what the dashboards chart; SQLite clustered by team and time, PostgreSQL covering indexes",
              {"sqlite": _SQLITE_V2, "postgres": _POSTGRES_V2}),
    Migration(3, "daily and hourly rollups, filled from the records already there (rollups.py)", {
        "sqlite": rollups_migration(SqliteDialect(), "INTEGER", "REAL", " WITHOUT ROWID"),
        "postgres": rollups_migration(PostgresDialect(), "BIGINT", "DOUBLE PRECISION")}),
    Migration(4, "budget alerts sent: one row per scope, period and threshold, so a fleet sends each once",
              {"sqlite": [_ALERTS.format(real="REAL")], "postgres": [_ALERTS.format(real="DOUBLE PRECISION")]}),
    Migration(5, "why each request's answer ended (finish_reason)", [_FINISH_REASON]),
    Migration(6, "budget refusals counted apart from rate limits in the rollups (rollups.py)", {
        "sqlite": budget_refusals_migration(SqliteDialect(), "INTEGER"),
        "postgres": budget_refusals_migration(PostgresDialect(), "BIGINT")}),
    Migration(7, "the caller's own X-Request-Id (client_request_id)", _CLIENT_REQUEST_ID),
    Migration(8, "cached prompt tokens, batch lines (batch_id, custom_id), cached-input and batch prices, savings; "
              "the rollups sum them (rollups.py)", {"sqlite": _SQLITE_V8, "postgres": _POSTGRES_V8}),
    Migration(9, "Predicted Outputs' accepted and rejected prediction tokens",
              {"sqlite": _prediction_columns("INTEGER"), "postgres": _prediction_columns("BIGINT")}),
    Migration(10, "the caller's end user and tags (end_user, tags)", _END_USERS),
    Migration(11, "hourly latency and time-to-first-token histograms and failures by status per team and model, "
              "filled from the records (latency_rollup.py, failure_rollup.py); the fleet's state of each health alert "
              "(health_alert_states)", {
                  "sqlite": [*latency_rollup.migration(SqliteDialect(), "INTEGER", "REAL", " WITHOUT ROWID"),
                             *failure_rollup.migration(SqliteDialect(), "INTEGER", " WITHOUT ROWID"),
                             _HEALTH_STATES.format(real="REAL")],
                  "postgres": [*latency_rollup.migration(PostgresDialect(), "BIGINT", "DOUBLE PRECISION"),
                               *failure_rollup.migration(PostgresDialect(), "BIGINT"),
                               _HEALTH_STATES.format(real="DOUBLE PRECISION")]}),
], legacy_table="billing_schema_migrations")
