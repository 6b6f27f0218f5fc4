"""A ledger written before the dashboards (schema 1, and its write-ahead log, recorded in billing's own
bookkeeping table of then) opens under schema 3: records keep their values, the new fields read as absent,
the rollups hold the old records' sums. A log written before finish reasons (schema 5) replays beside new
entries, its records without one; every reason of the vocabulary is stored and read back, and no other."""

from __future__ import annotations

import sqlite3

import asyncpg
import msgspec
import pytest

from billing.filters import Selection
from billing.insights.overview import overview
from billing.ledger import Ledger
from billing.records import FINISH_REASONS, LedgerEntry
from billing.store.base import TABLE
from billing.store.schema import SCHEMA
from billing.usage import UsageQuery
from billing.wal import frame, segment_path
from storage.registry import parse
from tests.billing.factory import usage
from tests.billing.http import ts

V1_COLUMNS = ("request_id, time, day, team_id, key_id, user_id, model, dialect, route, prompt_tokens, "
              "completion_tokens, compute_tokens, status, latency_ms, ttft_ms, worker_id, input_price_micros, "
              "output_price_micros, cost_micros, recorded_at")
OLD_ROWS = [(f"old-{i}", ts("2025-01-10T00:00:00") + i * 3600.0, "2025-01-10", "team-a", f"key-{i % 3}",
             None if i % 2 else "usr_1", "small", "openai", "/v1/completions", 10 * i, i, i,
             "rejected" if i == 7 else "ok", 20.0 + i, 3.0, "w-1", 100_000, 400_000, (10 * i * 100_000 + i * 400_000
                                                                                   + 500_000) // 10**6, 1.7e9)
            for i in range(30)]
# where billing recorded its versions before storage's one table
MIGRATIONS_TABLE = "billing_schema_migrations"
MIGRATIONS_DDL = f"CREATE TABLE {MIGRATIONS_TABLE} (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION NOT NULL)"


async def write_schema_1(database_url: str) -> None:
    marks = ", ".join(["?"] * 20)
    if database_url.startswith("sqlite"):
        db = sqlite3.connect(parse(database_url)[1])
        db.execute(MIGRATIONS_DDL)
        for sql in SCHEMA.migrations[0].sql("sqlite"):
            db.execute(sql)
        db.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES (1, 0)")
        db.executemany(f"INSERT INTO {TABLE} ({V1_COLUMNS}) VALUES ({marks})", OLD_ROWS)
        db.commit()
        db.close()
        return
    con = await asyncpg.connect(database_url)
    try:
        await con.execute(MIGRATIONS_DDL)
        for sql in SCHEMA.migrations[0].sql("postgres"):
            await con.execute(sql)
        await con.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES (1, 0)")
        await con.copy_records_to_table(TABLE, records=OLD_ROWS, columns=V1_COLUMNS.split(", "))
    finally:
        await con.close()


def old_wal_frame(request_id: str) -> bytes:
    """A log entry as a schema-1 gateway wrote it: the usage record has 15 fields, not 19."""
    record = [request_id, ts("2025-01-11T00:00:00"), "team-a", "key-0", None, "small", "openai", "/v1/completions",
              100, 10, 10, "ok", 12.0, 2.0, "w-1"]
    return frame(msgspec.msgpack.encode([record, 100_000, 400_000, 14, 1.7e9]))


async def test_schema_1_ledger_and_log_open_under_schema_3(database_url, wal_dir, pricing):
    await write_schema_1(database_url)
    wal_dir.mkdir()
    segment_path(wal_dir, 1).write_bytes(old_wal_frame("old-wal-1") + old_wal_frame("old-wal-2"))
    ledger = await Ledger.open(database_url, wal_dir, pricing)
    try:
        entries = {e.usage.request_id: e for e in await ledger.records(UsageQuery(start=0.0, end=4e9))}
        assert set(entries) == {r[0] for r in OLD_ROWS} | {"old-wal-1", "old-wal-2"}  # the log was replayed
        for row in OLD_ROWS:
            u = entries[row[0]].usage
            assert (u.time, u.key_id, u.user_id, u.prompt_tokens, u.status, entries[row[0]].cost_micros) == (
                row[1], row[4], row[5], row[9], row[12], row[18])
            assert (u.cold_start_ms, u.error_code, u.error_status, u.adapter, u.finish_reason) == (
                None, None, None, "", None)
        # the rollups were filled from the old records: the overview (rollups for whole days) equals them
        await ledger.record(usage(request_id="new-1", team_id="team-a", time=ts("2025-01-10T12:30:00"),
                                  error_code="rate_limit_exceeded", error_status=429, status="rejected",
                                  prompt_tokens=0, completion_tokens=0, compute_tokens=0, cold_start_ms=5.0))
        await ledger.flush(10)
        view = await overview(ledger.store, Selection(ts("2025-01-01"), ts("2025-02-01"), "team-a"))
        everything = await ledger.records(UsageQuery(start=0.0, end=4e9))
        assert view.totals.requests == len(everything) == 33
        assert view.totals.prompt_tokens == sum(e.usage.prompt_tokens for e in everything)
        assert view.totals.cost_micros == sum(e.cost_micros for e in everything)
        assert (view.totals.rejected, view.totals.rate_limited, sum(view.series.cold_starts)) == (2, 1, 1)
        assert {s.key for s in view.by_user} == {"usr_1", "-"}
    finally:
        await ledger.close()
    # opening again applies nothing twice
    ledger = await Ledger.open(database_url, wal_dir, pricing)
    try:
        report = await ledger.usage(UsageQuery(start=0.0, end=4e9, group_by="none"))
        assert report.totals.requests == 33
    finally:
        await ledger.close()


def schema_4_wal_frame(request_id: str) -> bytes:
    """A log entry as a gateway of schemas 2 to 4 wrote it: 19 fields, the last the adapter, no finish reason."""
    record = [request_id, ts("2025-01-11T00:00:00"), "team-a", "key-0", None, "small", "openai", "/v1/completions",
              100, 10, 10, "ok", 12.0, 2.0, "w-1", 1500.0, None, None, "poet"]
    return frame(msgspec.msgpack.encode([record, 100_000, 400_000, 14, 1.7e9]))


async def test_a_log_written_before_finish_reasons_replays_beside_new_entries(database_url, wal_dir, pricing):
    wal_dir.mkdir()
    new = usage(request_id="new-1", time=ts("2025-01-11T00:00:01"), finish_reason="tool_calls")
    new_frame = frame(msgspec.msgpack.encode(LedgerEntry(new, 100_000, 400_000, 14, 1.7e9)))
    segment_path(wal_dir, 1).write_bytes(schema_4_wal_frame("old-1") + new_frame + schema_4_wal_frame("old-2"))
    ledger = await Ledger.open(database_url, wal_dir, pricing)
    try:
        entries = {e.usage.request_id: e.usage for e in await ledger.records(UsageQuery(start=0.0, end=4e9))}
    finally:
        await ledger.close()
    assert {rid: (u.adapter, u.cold_start_ms, u.finish_reason) for rid, u in entries.items()} == {
        "old-1": ("poet", 1500.0, None), "old-2": ("poet", 1500.0, None), "new-1": ("", None, "tool_calls")}


async def test_every_finish_reason_is_stored_and_read_back(ledger):
    records = [usage(request_id=f"r-{reason}", finish_reason=reason) for reason in (*FINISH_REASONS, None)]
    for record in records:
        await ledger.record(record)
    await ledger.flush(10)
    stored = {e.usage.request_id: e.usage.finish_reason for e in await ledger.records(UsageQuery(start=0.0, end=4e9))}
    assert stored == {r.request_id: r.finish_reason for r in records}


@pytest.mark.parametrize("bad", [{"cold_start_ms": -1.0}, {"error_status": 99}, {"error_status": 600},
                                 {"adapter": None}, {"cold_start_ms": float("nan")}, {"finish_reason": "exploded"},
                                 {"finish_reason": "STOP"}, {"finish_reason": ""}])
async def test_new_fields_are_validated_up_front(ledger, bad):
    with pytest.raises(ValueError):
        await ledger.record(usage(**bad))
