"""What a usage store does, and the row layout both SQL backends share."""

from __future__ import annotations

import time
from typing import Protocol

from billing.records import LedgerEntry, UsageRecord
from billing.usage import UsageQuery, UsageRow

TABLE = "usage_records"
MIGRATIONS_TABLE = "billing_schema_migrations"

COLUMNS: tuple[str, ...] = (
    "request_id", "time", "day", "team_id", "key_id", "user_id", "model", "dialect", "route",
    "prompt_tokens", "completion_tokens", "compute_tokens", "status", "latency_ms", "ttft_ms",
    "worker_id", "input_price_micros", "output_price_micros", "cost_micros", "recorded_at",
)

# group_by -> SQL expression; a fixed whitelist, never user text in SQL
GROUP_EXPR = {"day": "day", "model": "model", "key": "key_id", "team": "team_id", "none": "''"}


def utc_day(unix: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(unix))


def entry_row(entry: LedgerEntry) -> tuple:
    u = entry.usage
    return (u.request_id, u.time, utc_day(u.time), u.team_id, u.key_id, u.user_id, u.model, u.dialect,
            u.route, u.prompt_tokens, u.completion_tokens, u.compute_tokens, u.status, u.latency_ms,
            u.ttft_ms, u.worker_id, entry.input_price_micros, entry.output_price_micros,
            entry.cost_micros, entry.recorded_at)


def row_entry(row) -> LedgerEntry:
    (request_id, t, _day, team_id, key_id, user_id, model, dialect, route, prompt, completion, compute,
     status, latency_ms, ttft_ms, worker_id, in_price, out_price, cost, recorded_at) = tuple(row)
    usage = UsageRecord(request_id, t, team_id, key_id, user_id, model, dialect, route, prompt, completion,
                        compute, status, latency_ms, ttft_ms, worker_id)
    return LedgerEntry(usage, in_price, out_price, cost, recorded_at)


def aggregate_sql(query: UsageQuery, placeholder) -> tuple[str, list]:
    """SELECT of the grouped sums; `placeholder(i)` spells the i-th (1-based) parameter."""
    key = GROUP_EXPR[query.group_by]
    params: list = [query.start, query.end]
    where = f"time >= {placeholder(1)} AND time < {placeholder(2)}"
    if query.team_id is not None:
        params.append(query.team_id)
        where += f" AND team_id = {placeholder(3)}"
    sql = (f"SELECT {key} AS k, COUNT(*), SUM(prompt_tokens), SUM(completion_tokens), "
           f"SUM(compute_tokens), SUM(cost_micros) FROM {TABLE} WHERE {where} GROUP BY k ORDER BY k")
    return sql, params


def to_rows(result) -> list[UsageRow]:
    return [UsageRow(str(k), int(n), int(p), int(c), int(g), int(cost)) for k, n, p, c, g, cost in result]


def records_sql(query: UsageQuery, placeholder) -> tuple[str, list]:
    params: list = [query.start, query.end]
    where = f"time >= {placeholder(1)} AND time < {placeholder(2)}"
    if query.team_id is not None:
        params.append(query.team_id)
        where += f" AND team_id = {placeholder(3)}"
    return f"SELECT {', '.join(COLUMNS)} FROM {TABLE} WHERE {where} ORDER BY time, request_id", params


class UsageStore(Protocol):
    async def insert(self, entries: list[LedgerEntry]) -> int:
        """Store entries, ignoring request ids already present; returns how many were new."""

    async def aggregate(self, query: UsageQuery) -> list[UsageRow]: ...

    async def records(self, query: UsageQuery) -> list[LedgerEntry]: ...

    async def count(self, request_ids: list[str]) -> dict[str, int]:
        """How many stored rows carry each id (0 or 1; for audits and tests)."""

    async def close(self) -> None: ...
