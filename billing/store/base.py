"""What a usage store does, and the row layout both SQL backends share."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import msgspec

from billing.records import LedgerEntry, UsageRecord
from storage import Database
from storage.sql_dialect import SqlDialect

TABLE = "usage_records"

COLUMNS: tuple[str, ...] = (
    "request_id", "time", "day", "team_id", "key_id", "user_id", "model", "dialect", "route",
    "prompt_tokens", "completion_tokens", "compute_tokens", "status", "latency_ms", "ttft_ms",
    "worker_id", "input_price_micros", "output_price_micros", "cost_micros", "recorded_at",
    "cold_start_ms", "error_code", "error_status", "adapter", "finish_reason", "client_request_id",
    "cached_tokens", "batch_id", "custom_id", "cached_input_price_micros", "batch_discount_percent",
    "cache_saved_micros", "batch_saved_micros", "accepted_prediction_tokens", "rejected_prediction_tokens",
    "end_user", "tags",
)
ENTRY_COLUMNS = ", ".join(COLUMNS)  # what `row_entry` reads, in order
# insert-once of a sent budget alert: a row back when this store recorded it, none when another had
CLAIM_ALERT = ("INSERT INTO budget_alerts (scope, period, threshold, sent_at) VALUES (?, ?, ?, ?) "
               "ON CONFLICT DO NOTHING RETURNING threshold")
# a health alert's fleet-wide state (fired 1 / armed 0) as judged at a time: a row back only when this judgement
# changed it (a new row, or a change by a judgement later than the one that set it)
HEALTH_STATE = ("INSERT INTO health_alert_states (scope, measure, fired, changed_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (scope, measure) DO UPDATE SET fired = excluded.fired, changed_at = excluded.changed_at "
                "WHERE health_alert_states.fired <> excluded.fired "
                "AND health_alert_states.changed_at < excluded.changed_at RETURNING fired")


_tags = msgspec.json.Decoder(dict[str, str])


def tags_text(tags: dict[str, str]) -> str | None:
    """A record's tags as the `tags` column holds them: compact JSON, keys sorted (None: no tags), so one pair is
    always spelled the same (`tag_pattern`)."""
    return msgspec.json.encode(dict(sorted(tags.items()))).decode() if tags else None


def tag_pattern(key: str, value: str) -> str:
    """The text that a `tags` column holds exactly when the record has the pair key=value: its JSON spelling, quotes
    included, so "a":"b" never matches "a":"bc" (a quote inside a key or value is escaped in the column)."""
    return msgspec.json.encode({key: value}).decode()[1:-1]


def utc_day(unix: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(unix))


def entry_row(entry: LedgerEntry) -> tuple[Any, ...]:
    u = entry.usage
    return (u.request_id, u.time, utc_day(u.time), u.team_id, u.key_id, u.user_id, u.model, u.dialect,
            u.route, u.prompt_tokens, u.completion_tokens, u.compute_tokens, u.status, u.latency_ms,
            u.ttft_ms, u.worker_id, entry.input_price_micros, entry.output_price_micros,
            entry.cost_micros, entry.recorded_at, u.cold_start_ms, u.error_code, u.error_status, u.adapter,
            u.finish_reason, u.client_request_id, u.cached_tokens, u.batch_id, u.custom_id,
            entry.cached_input_price_micros, entry.batch_discount_percent, entry.cache_saved_micros,
            entry.batch_saved_micros, u.accepted_prediction_tokens, u.rejected_prediction_tokens, u.end_user,
            tags_text(u.tags))


def row_entry(row: Sequence[Any]) -> LedgerEntry:
    (request_id, t, _day, team_id, key_id, user_id, model, dialect, route, prompt, completion, compute,
     status, latency_ms, ttft_ms, worker_id, in_price, out_price, cost, recorded_at, cold_start_ms, error_code,
     error_status, adapter, finish_reason, client_request_id, cached_tokens, batch_id, custom_id, cached_price,
     batch_discount, cache_saved, batch_saved, accepted_prediction, rejected_prediction, end_user,
     tags) = tuple(row)
    usage = UsageRecord(request_id, t, team_id, key_id, user_id, model, dialect, route, prompt, completion,
                        compute, status, latency_ms, ttft_ms, worker_id, cold_start_ms, error_code, error_status,
                        adapter, finish_reason, client_request_id, cached_tokens, batch_id, custom_id,
                        accepted_prediction, rejected_prediction, end_user, _tags.decode(tags) if tags else {})
    return LedgerEntry(usage, in_price, out_price, cost, recorded_at, cached_price, batch_discount, cache_saved,
                       batch_saved)


class AlertStates:
    """The alert claims both stores write alike (one SQL; storage/sql_text.py spells it per backend)."""

    _db: Database

    async def claim_alert(self, scope: str, period: str, threshold: int, at: float) -> bool:
        """Record that `scope`'s alert at `threshold` % of `period` is sent; False when a gateway of the fleet
        recorded it first (insert-once on the table's primary key)."""
        async with self._db.transaction() as tx:
            row = await tx.fetchone(CLAIM_ALERT, (scope, period, threshold, at))
        return row is not None

    async def set_health_state(self, scope: str, measure: str, fired: bool, at: float) -> bool:
        """Record a health alert as fired or armed by a judgement at `at`; True when this call changed it (so a
        gateway that fired it sends the alert, and no other does)."""
        async with self._db.transaction() as tx:
            row = await tx.fetchone(HEALTH_STATE, (scope, measure, int(fired), at))
        return row is not None


class UsageStore(Protocol):
    dialect: SqlDialect

    async def insert(self, entries: list[LedgerEntry]) -> int:
        """Store entries, ignoring request ids already present; returns how many were new."""

    async def claim_alert(self, scope: str, period: str, threshold: int, at: float) -> bool:
        """Record a budget alert as sent; False when it was already recorded (by any gateway)."""

    async def set_health_state(self, scope: str, measure: str, fired: bool, at: float) -> bool:
        """Set a health alert fired or armed fleet-wide as judged at `at`; True when this call changed it."""

    async def fetch(self, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """Rows of one read-only statement (committed data only)."""

    async def count(self, request_ids: list[str]) -> dict[str, int]:
        """How many stored rows carry each id (0 or 1; for audits and tests)."""

    async def close(self) -> None: ...
