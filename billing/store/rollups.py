"""Rollups of the ledger, kept by the writer in the transaction that inserts the records, so they
always hold exactly the sums of the stored records (a replayed record is not new, and is not added).

- `usage_daily`: per team and UTC day, one row per combination of everything a view filters or
  breaks down by (model, key, user, dialect, status, error status, adapter) and the prices: tiles,
  breakdowns, daily UTC series, rankings and statements of whole days read it instead of the
  records. A team's records of a day share few such combinations (a key has one user, one SDK and
  mostly one model), so a day of a busy team is tens of rows, not thousands.
- `usage_hourly`: per team, UTC hour and model: the series by hour, and by local day in zones whose
  offsets are whole hours, when no filter other than the model is set.

Both count the requests a budget refused (`budget_refused`, error code `records.BUDGET_REFUSED`, whatever status
the dialect answered) apart from rate limits (schema 6); the hourly `rate_limited` counts 429s that were not.

Both also sum what schema 8 added (cached prompt tokens, batch lines, their cost, what the cache and the batch
rate saved), and the daily key holds the cached-input price, the batch discount and whether the records were
batch lines (`batched`), so statements read whole days from it.

Integer sums only, so a rollup is exact; NULL-free keys (a user-less request is user_id '', no error
status 0), because NULLs never collide in a unique key.
"""

from __future__ import annotations

from typing import Any

from billing.records import BUDGET_REFUSED, LedgerEntry
from billing.store.base import TABLE
from storage.sql_dialect import SqlDialect

DAILY, HOURLY = "usage_daily", "usage_hourly"
DAY, HOUR = 86400, 3600
_DAILY_KEY_V3 = ("team_id", "period", "model", "key_id", "user_id", "dialect", "status", "error_status", "adapter",
                 "input_price_micros", "output_price_micros")
# schema 8: the cached-input price and batch discount in force, and whether the records were batch lines, so a
# statement's line (model, prices, batch or not) reads whole days from here
DAILY_KEY = (*_DAILY_KEY_V3, "cached_input_price_micros", "batch_discount_percent", "batched")
HOURLY_KEY = ("team_id", "period", "model")
# (column, how the raw records fill it); cold_start_ms_max merges by max (and stays last), the others add up
_COLD = (("cold_starts", "COUNT(cold_start_ms)"), ("cold_start_ms_total", "COALESCE(SUM(cold_start_ms), 0)"),
         ("cold_start_ms_max", "COALESCE(MAX(cold_start_ms), 0)"))
_TOKENS = (("requests", "COUNT(*)"), ("prompt_tokens", "SUM(prompt_tokens)"),
           ("completion_tokens", "SUM(completion_tokens)"), ("compute_tokens", "SUM(compute_tokens)"))
BUDGET_REFUSED_SQL = f"SUM(CASE WHEN error_code = '{BUDGET_REFUSED}' THEN 1 ELSE 0 END)"
RATE_LIMITED_SQL = (f"SUM(CASE WHEN error_status = 429 AND COALESCE(error_code, '') <> '{BUDGET_REFUSED}' "
                    "THEN 1 ELSE 0 END)")
BATCHED_SQL = "CASE WHEN batch_id IS NULL THEN 0 ELSE 1 END"
# schema 8's sums over the records: cached prompt tokens, batch lines and their cost, what the cache and the batch
# rate saved against the list prices (usage.UsageRow names them)
SAVINGS = (("cached_tokens", "SUM(cached_tokens)"), ("batch_requests", f"SUM({BATCHED_SQL})"),
           ("batch_cost_micros", "SUM(CASE WHEN batch_id IS NULL THEN 0 ELSE cost_micros END)"),
           ("cache_saved_micros", "SUM(cache_saved_micros)"), ("batch_saved_micros", "SUM(batch_saved_micros)"))
# schema 3's and 6's columns (their migrations are history: they keep them)
_DAILY_SUMS_V3 = (*_TOKENS, ("output_tokens", "SUM({output})"), ("cost_micros", "SUM(cost_micros)"), *_COLD)
_HOURLY_SUMS_V3 = (*_TOKENS, ("cost_micros", "SUM(cost_micros)"),
                   ("rate_limited", "SUM(CASE WHEN error_status = 429 THEN 1 ELSE 0 END)"), *_COLD)
_DAILY_SUMS_V6 = (*_TOKENS, ("output_tokens", "SUM({output})"), ("cost_micros", "SUM(cost_micros)"),
                  ("budget_refused", BUDGET_REFUSED_SQL), *_COLD)
_HOURLY_SUMS_V6 = (*_TOKENS, ("cost_micros", "SUM(cost_micros)"), ("rate_limited", RATE_LIMITED_SQL),
                   ("budget_refused", BUDGET_REFUSED_SQL), *_COLD)
DAILY_SUMS = (*_DAILY_SUMS_V6[:-len(_COLD)], *SAVINGS, *_COLD)
HOURLY_SUMS = (*_HOURLY_SUMS_V6[:-len(_COLD)], *SAVINGS, *_COLD)
Sums = tuple[tuple[str, str], ...]  # (column, the SQL that sums it)
_TEXT_KEYS = {"team_id", "model", "key_id", "user_id", "dialect", "status", "adapter"}


def column_kinds(key: tuple[str, ...], sums: Sums) -> list[tuple[str, str]]:
    """(column, "text" | "integer" | "real") of a rollup, in its upsert's order."""
    return ([(c, "text" if c in _TEXT_KEYS else "integer") for c in key]
            + [(c, "real" if c.startswith("cold_start_ms") or c == "streamed_ms" else "integer") for c, _ in sums])


def _table(name: str, key: tuple[str, ...], sums: Sums, integer: str, real: str) -> str:
    types = {"text": "TEXT", "integer": integer, "real": real}
    columns = [f"{c} {types[kind]} NOT NULL" for c, kind in column_kinds(key, sums)]
    return f"CREATE TABLE {name} ({', '.join(columns)}, PRIMARY KEY ({', '.join(key)}))"


def _backfill(dialect: SqlDialect, name: str, key: tuple[str, ...], sums: Sums, period: int) -> str:
    """Fills a new rollup from the records already stored."""
    from_raw = {"period": f"{dialect.floor_div('time', period)} * {period}", "user_id": "COALESCE(user_id, '')",
                "error_status": "COALESCE(error_status, 0)",
                "cached_input_price_micros": "COALESCE(cached_input_price_micros, input_price_micros)",
                "batched": BATCHED_SQL}
    keys = [from_raw.get(c, c) for c in key]
    output = dialect.greatest("compute_tokens", "completion_tokens")
    values = [expr.format(output=output) for _, expr in sums]
    group = ", ".join(str(i) for i in range(1, len(key) + 1))
    return (f"INSERT INTO {name} ({', '.join(key)}, {', '.join(c for c, _ in sums)}) "
            f"SELECT {', '.join(keys)}, {', '.join(values)} FROM {TABLE} GROUP BY {group}")


def backfill(dialect: SqlDialect) -> list[str]:
    """Statements that fill empty rollups (of the current schema) from the stored records (a bulk load)."""
    return [_backfill(dialect, DAILY, DAILY_KEY, DAILY_SUMS, DAY),
            _backfill(dialect, HOURLY, HOURLY_KEY, HOURLY_SUMS, HOUR)]


def migration(dialect: SqlDialect, integer: str, real: str, without_rowid: str = "") -> list[str]:
    """Schema 3: the rollups with their first columns, filled."""
    return [_table(DAILY, _DAILY_KEY_V3, _DAILY_SUMS_V3, integer, real) + without_rowid,
            _table(HOURLY, HOURLY_KEY, _HOURLY_SUMS_V3, integer, real) + without_rowid,
            _backfill(dialect, DAILY, _DAILY_KEY_V3, _DAILY_SUMS_V3, DAY),
            _backfill(dialect, HOURLY, HOURLY_KEY, _HOURLY_SUMS_V3, HOUR)]


def budget_refusals_migration(dialect: SqlDialect, integer: str) -> list[str]:
    """Schema 6: budget refusals counted apart from rate limits; both rollups refilled from the records."""
    return [f"ALTER TABLE {DAILY} ADD COLUMN budget_refused {integer} NOT NULL DEFAULT 0",
            f"ALTER TABLE {HOURLY} ADD COLUMN budget_refused {integer} NOT NULL DEFAULT 0",
            f"DELETE FROM {DAILY}", f"DELETE FROM {HOURLY}",
            _backfill(dialect, DAILY, _DAILY_KEY_V3, _DAILY_SUMS_V6, DAY),
            _backfill(dialect, HOURLY, HOURLY_KEY, _HOURLY_SUMS_V6, HOUR)]


def savings_migration(dialect: SqlDialect, integer: str, real: str, without_rowid: str = "") -> list[str]:
    """Schema 8: cached tokens, batch lines and savings summed, the daily key widened by the cached-input price,
    the batch discount and `batched` (a new primary key: both rollups are made anew and refilled from the
    records, which migration 8 has just given their columns)."""
    daily, hourly = _V8
    return [f"DROP TABLE {DAILY}", f"DROP TABLE {HOURLY}",
            _table(DAILY, daily[0], daily[1], integer, real) + without_rowid,
            _table(HOURLY, hourly[0], hourly[1], integer, real) + without_rowid,
            _backfill(dialect, DAILY, *daily, DAY), _backfill(dialect, HOURLY, *hourly, HOUR)]


_V8 = ((DAILY_KEY, DAILY_SUMS), (HOURLY_KEY, HOURLY_SUMS))  # the next migration freezes these before changing them


def upsert_sql(dialect: SqlDialect, name: str, key: tuple[str, ...], sums: Sums, *,
               arrays: dict[str, str] | None = None) -> str:
    """The upsert adding one increment row; with `arrays` (PostgreSQL type per kind) it takes one
    array per column and adds every row in one statement."""
    columns = [*key, *(c for c, _ in sums)]
    if arrays is None:
        source = f"VALUES ({', '.join('?' * len(columns))})"
    else:
        source = "SELECT * FROM unnest(" + ", ".join(
            f"?::{arrays[kind]}[]" for _, kind in column_kinds(key, sums)) + ")"
    updates = [f"{c} = {dialect.greatest(f'{name}.{c}', f'excluded.{c}')}" if c == "cold_start_ms_max"
               else f"{c} = {name}.{c} + excluded.{c}" for c, _ in sums]
    return (f"INSERT INTO {name} ({', '.join(columns)}) {source} "
            f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {', '.join(updates)}")


def upserts(dialect: SqlDialect, *, arrays: dict[str, str] | None = None) -> tuple[str, str]:
    """(daily, hourly) upserts; see `upsert_sql`."""
    return (upsert_sql(dialect, DAILY, DAILY_KEY, DAILY_SUMS, arrays=arrays),
            upsert_sql(dialect, HOURLY, HOURLY_KEY, HOURLY_SUMS, arrays=arrays))


def rollup_rows(entries: list[LedgerEntry]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The rollups' increments for newly stored entries: (daily rows, hourly rows), each sorted by
    key so that concurrent writers lock rollup rows in the same order (no deadlock)."""
    daily: dict[tuple[Any, ...], list[Any]] = {}
    hourly: dict[tuple[Any, ...], list[Any]] = {}
    for e in entries:
        u = e.usage
        cold = u.cold_start_ms
        waited = (1, cold, cold) if cold is not None else (0, 0.0, 0.0)
        day = int(u.time // DAY) * DAY
        batched = int(u.batch_id is not None)
        cached_price = e.cached_input_price_micros
        key = (u.team_id, day, u.model, u.key_id, u.user_id or "", u.dialect, u.status, u.error_status or 0, u.adapter,
               e.input_price_micros, e.output_price_micros,
               e.input_price_micros if cached_price is None else cached_price, e.batch_discount_percent, batched)
        budget = int(u.error_code == BUDGET_REFUSED)
        saved = (u.cached_tokens, batched, e.cost_micros * batched, e.cache_saved_micros, e.batch_saved_micros)
        _add(daily, key, (1, u.prompt_tokens, u.completion_tokens, u.compute_tokens,
                          max(u.compute_tokens, u.completion_tokens), e.cost_micros, budget, *saved, *waited))
        _add(hourly, (u.team_id, int(u.time // HOUR) * HOUR, u.model),
             (1, u.prompt_tokens, u.completion_tokens, u.compute_tokens, e.cost_micros,
              int(u.error_status == 429 and not budget), budget, *saved, *waited))
    return ([(*k, *v) for k, v in sorted(daily.items())], [(*k, *v) for k, v in sorted(hourly.items())])


def _add(groups: dict[tuple[Any, ...], list[Any]], key: tuple[Any, ...], values: tuple[Any, ...]) -> None:
    current = groups.get(key)
    if current is None:
        groups[key] = list(values)
        return
    for i in range(len(values) - 1):
        current[i] += values[i]
    current[-1] = max(current[-1], values[-1])  # cold_start_ms_max
