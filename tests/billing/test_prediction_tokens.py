"""Predicted Outputs' token counts in the ledger (billing migration 9), on SQLite and PostgreSQL: a record keeps its
accepted and rejected prediction tokens within its completion tokens, log entries written before them (schemas 7
and 8) replay beside new ones, a version-8 database is migrated with its records, and the records' readers (the
records page, the CSV and the S3 export) carry both."""

from __future__ import annotations

import csv
import gzip
import io
import json
from datetime import date

import msgspec
import pytest

import storage
from billing.exports.csv import RECORD_FIELDS, records_csv
from billing.exports.s3 import export_day
from billing.filters import Selection
from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.records import LedgerEntry, Price
from billing.store.base import COLUMNS, TABLE
from billing.store.schema import SCHEMA
from billing.usage import UsageQuery
from billing.wal import frame, segment_path
from storage import Schema
from tests.billing.factory import usage
from tests.billing.http import ts
from tests.billing.test_cached_and_batch import _schema_7_frame

PRICES = {"small": Price(1_000_000, 4_000_000)}
DAY = ts("2025-03-10")


async def _entries(ledger: Ledger) -> dict[str, LedgerEntry]:
    return {e.usage.request_id: e for e in await ledger.records(UsageQuery(start=0.0, end=4e9))}


def _counts(entry: LedgerEntry) -> tuple[int, int, int]:
    u = entry.usage
    return u.accepted_prediction_tokens, u.rejected_prediction_tokens, u.completion_tokens


async def test_prediction_tokens_are_stored_within_the_completion_and_exported(database_url, wal_dir, s3):
    ledger = await Ledger.open(database_url, wal_dir, PricingTable.static(PRICES))
    try:
        for rid, accepted, rejected, completion, status in [
                ("predicted", 40, 7, 50, "ok"), ("plain", 0, 0, 5, "ok"),
                ("overstated", 30, 9, 12, "ok"),  # more than the completion: rejected first, then the rest
                ("all-rejected", 5, 20, 8, "ok"), ("refused", 3, 2, 0, "rejected")]:
            await ledger.record(usage(request_id=rid, time=DAY + 60, prompt_tokens=0 if status == "rejected" else 10,
                                      completion_tokens=completion, compute_tokens=completion, status=status,
                                      accepted_prediction_tokens=accepted, rejected_prediction_tokens=rejected))
        with pytest.raises(ValueError, match="invalid usage record"):
            await ledger.record(usage(request_id="negative", rejected_prediction_tokens=-1))
        await ledger.flush(10)
        entries = await _entries(ledger)
        # the rejected tokens are billed inside completion_tokens, nothing on top
        assert entries["predicted"].cost_micros == PRICES["small"].cost(10, 50)
        lines = [line async for line in records_csv(ledger.store, Selection(DAY, DAY + 86400, "team-a"))]
        s3.create_bucket(Bucket="predicted")
        await export_day(ledger.store, s3, "predicted", date(2025, 3, 10), team_ids=["team-a"])
        body = s3.get_object(Bucket="predicted", Key="team-a/2025-03-10.jsonl.gz")["Body"].read()
    finally:
        await ledger.close()
    assert {rid: _counts(e) for rid, e in entries.items()} == {
        "predicted": (40, 7, 50), "plain": (0, 0, 5), "overstated": (3, 9, 12), "all-rejected": (0, 8, 8),
        "refused": (0, 0, 0)}
    assert "negative" not in entries
    rows = {r["request_id"]: r for r in csv.DictReader(io.StringIO("".join(lines)))}
    assert {"accepted_prediction_tokens", "rejected_prediction_tokens"} <= set(RECORD_FIELDS)
    assert (rows["predicted"]["accepted_prediction_tokens"], rows["predicted"]["rejected_prediction_tokens"]) == (
        "40", "7")
    exported = {line["request_id"]: line for line in map(json.loads, gzip.decompress(body).splitlines())}
    assert exported["predicted"] == entries["predicted"].flat()
    assert (exported["overstated"]["accepted_prediction_tokens"], exported["overstated"]["rejected_prediction_tokens"]
            ) == (3, 9)


def _schema_8_frame(request_id: str) -> bytes:
    """A log entry as a gateway of schema 8 wrote it: 24 record fields (the last the batch line's custom_id), nine of
    the entry; no prediction tokens."""
    record = [request_id, DAY + 60, "team-a", "key-0", None, "small", "openai", "/v1/completions", 100, 10, 10, "ok",
              12.0, 2.0, "w-1", None, None, None, "", "stop", None, 40, "batch_8", "line-8"]
    return frame(msgspec.msgpack.encode([record, 1_000_000, 4_000_000, 140, 1.7e9, 1_000_000, 0, 0, 0]))


async def test_a_log_written_before_schema_9_replays_beside_new_entries(database_url, wal_dir):
    wal_dir.mkdir()
    new = usage(request_id="new-1", time=DAY + 120, completion_tokens=9, compute_tokens=9,
                accepted_prediction_tokens=6, rejected_prediction_tokens=2)
    new_frame = frame(msgspec.msgpack.encode(LedgerEntry(new, 1_000_000, 4_000_000, 46, 1.7e9, 1_000_000)))
    segment_path(wal_dir, 1).write_bytes(_schema_7_frame("old-7") + _schema_8_frame("old-8") + new_frame)
    ledger = await Ledger.open(database_url, wal_dir, PricingTable.static(PRICES))
    try:
        entries = await _entries(ledger)
    finally:
        await ledger.close()
    assert {rid: (*_counts(e), e.usage.cached_tokens, e.usage.batch_id, e.cost_micros)
            for rid, e in entries.items()} == {
        "old-7": (0, 0, 10, 0, None, 140), "old-8": (0, 0, 10, 40, "batch_8", 140), "new-1": (6, 2, 9, 0, None, 46)}


async def _write_version_8(database_url: str) -> None:
    """A billing database as a schema-8 gateway left it: its records (33 columns), no prediction tokens."""
    db = await storage.open(database_url)
    try:
        await storage.migrate(db, Schema("billing", SCHEMA.migrations[:8], legacy_table=SCHEMA.legacy_table))
        v8 = COLUMNS[:33]
        rows = [(f"old-{i}", DAY + i * 3600.0, "2025-03-10", "team-a", "key-1", None, "small", "openai",
                 "/v1/completions", 100 * i, i, i, "ok", 10.0, 1.0, "w-1", 1_000_000, 4_000_000, 104 * i, 1.7e9, None,
                 None, None, "", "stop", None, 0, None, None, 1_000_000, 0, 0, 0) for i in range(1, 4)]
        async with db.transaction() as tx:
            await tx.executemany(f"INSERT INTO {TABLE} ({', '.join(v8)}) VALUES ({', '.join('?' * len(v8))})", rows)
    finally:
        await db.close()


async def test_migration_9_upgrades_a_version_8_database_with_its_records(database_url, wal_dir):
    await _write_version_8(database_url)
    ledger = await Ledger.open(database_url, wal_dir, PricingTable.static(PRICES))
    try:
        await ledger.record(usage(request_id="new", time=DAY + 5 * 3600, completion_tokens=20, compute_tokens=20,
                                  accepted_prediction_tokens=15, rejected_prediction_tokens=4))
        await ledger.flush(10)
        applied = await ledger.store.fetch("SELECT version FROM schema_migrations WHERE package = 'billing' "
                                           "ORDER BY version", [])
        entries = await _entries(ledger)
    finally:
        await ledger.close()
    assert [v for (v,) in applied] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert {rid: _counts(e) for rid, e in entries.items()} == {
        "old-1": (0, 0, 1), "old-2": (0, 0, 2), "old-3": (0, 0, 3), "new": (15, 4, 20)}
    assert entries["old-2"].cost_micros == 208
