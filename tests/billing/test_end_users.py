"""End users and tags in the ledger (billing migration 10), on SQLite and PostgreSQL: stored, found by end user and
by tag pairs (exactly: no prefix, no wildcard, no case folding; every pair asked for), never across teams, carried
by the records page and the CSV (JSON tags; a formula-led end user made text) and the S3 export; bounded before the
log; log entries from before them replay; a version-9 database is migrated with its records."""

from __future__ import annotations

import csv
import io
import json

import msgspec

import storage
from billing.bounds import MAX_TAGS, TRIMMED, bounded
from billing.exports.csv import records_csv
from billing.filters import Filters, Selection
from billing.insights.requests import page
from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.records import LedgerEntry, Price
from billing.store.base import COLUMNS, TABLE
from billing.store.schema import SCHEMA
from billing.wal import frame, segment_path
from storage import Schema
from tests.billing.factory import usage
from tests.billing.http import ts

PRICES = {"small": Price(1_000_000, 4_000_000)}
DAY = ts("2025-03-10")
TRICKY = {"env": "prod", "q": 'a"b', "pct": "50%_x"}


async def _ids(ledger: Ledger, team: str | None = "team-a", **filters) -> set[str]:
    found = await page(ledger.store, Selection(DAY, DAY + 86400, team, Filters(**filters)), 100)
    return {e.usage.request_id for e in found.entries}


async def test_end_users_and_tags_are_stored_found_and_exported(database_url, wal_dir):
    ledger = await Ledger.open(database_url, wal_dir, PricingTable.static(PRICES))
    try:
        for rid, team, end_user, tags in [
                ("r1", "team-a", "alice", TRICKY), ("r2", "team-a", "bob", {"env": "prodx"}),
                ("r3", "team-a", None, {}), ("r4", "team-b", "alice", {"env": "prod"}),
                ("r5", "team-a", "=1+1", {"env": "PROD"})]:
            await ledger.record(usage(request_id=rid, team_id=team, time=DAY + 60, end_user=end_user, tags=tags))
        await ledger.flush(10)
        assert await _ids(ledger, end_users=("alice",)) == {"r1"}  # team-b's alice is not team-a's
        assert await _ids(ledger, None, end_users=("alice",)) == {"r1", "r4"}  # the operator's every team
        assert await _ids(ledger, tags=(("env", "prod"),)) == {"r1"}  # not prodx, not PROD
        assert await _ids(ledger, tags=(("q", 'a"b'), ("pct", "50%_x"))) == {"r1"}
        assert await _ids(ledger, tags=(("pct", "50%%x"),)) == set()  # % and _ are no wildcards
        assert await _ids(ledger, tags=(("env", "prod"), ("q", "other"))) == set()  # every pair
        assert await _ids(ledger, end_users=("bob",), tags=(("env", "prodx"),)) == {"r2"}
        stored = (await page(ledger.store, Selection(DAY, DAY + 86400, "team-a", Filters(end_users=("alice",))),
                             10)).entries[0]
        lines = [line async for line in records_csv(ledger.store, Selection(DAY, DAY + 86400, "team-a"))]
    finally:
        await ledger.close()
    assert (stored.usage.end_user, stored.usage.tags) == ("alice", TRICKY)
    assert stored.flat()["tags"] == TRICKY and stored.flat()["end_user"] == "alice"
    rows = {r["request_id"]: r for r in csv.DictReader(io.StringIO("".join(lines)))}
    assert json.loads(rows["r1"]["tags"]) == TRICKY and rows["r3"]["tags"] == "{}" and rows["r3"]["end_user"] == ""
    assert rows["r5"]["end_user"] == "'=1+1"  # a spreadsheet shows it as text
    assert "r4" not in rows


def test_a_records_tags_are_bounded_before_the_log():
    many = {f"k{i}": "v" for i in range(MAX_TAGS + 4)} | {"long": "x" * 600, "k" * 80: "v"}
    cut = bounded(usage(end_user="u" * 300, tags=many))
    assert len(cut.tags) == MAX_TAGS and len(cut.end_user) == 256 and cut.end_user.endswith(TRIMMED)
    assert all(len(k) <= 64 and len(v) <= 512 for k, v in cut.tags.items())


def _schema_9_frame(request_id: str) -> bytes:
    """A log entry as a gateway of schema 9 wrote it: 26 record fields (the last the rejected prediction tokens)."""
    record = [request_id, DAY + 60, "team-a", "key-0", None, "small", "openai", "/v1/completions", 100, 10, 10, "ok",
              12.0, 2.0, "w-1", None, None, None, "", "stop", None, 0, None, None, 0, 0]
    return frame(msgspec.msgpack.encode([record, 1_000_000, 4_000_000, 140, 1.7e9, 1_000_000, 0, 0, 0]))


async def test_a_version_9_database_and_log_are_carried_over(database_url, wal_dir):
    db = await storage.open(database_url)
    try:
        await storage.migrate(db, Schema("billing", SCHEMA.migrations[:9], legacy_table=SCHEMA.legacy_table))
        v9 = COLUMNS[:35]
        row = ("old-db", DAY + 3600.0, "2025-03-10", "team-a", "key-1", None, "small", "openai", "/v1/completions",
               100, 1, 1, "ok", 10.0, 1.0, "w-1", 1_000_000, 4_000_000, 104, 1.7e9, None, None, None, "", "stop",
               None, 0, None, None, 1_000_000, 0, 0, 0, 0, 0)
        async with db.transaction() as tx:
            await tx.execute(f"INSERT INTO {TABLE} ({', '.join(v9)}) VALUES ({', '.join('?' * len(v9))})", row)
    finally:
        await db.close()
    wal_dir.mkdir()
    new = usage(request_id="new", time=DAY + 120, end_user="carol", tags={"env": "ci"})
    segment_path(wal_dir, 1).write_bytes(_schema_9_frame("old-log") + frame(msgspec.msgpack.encode(
        LedgerEntry(new, 1_000_000, 4_000_000, 46, 1.7e9, 1_000_000))))
    ledger = await Ledger.open(database_url, wal_dir, PricingTable.static(PRICES))
    try:
        await ledger.flush(10)
        entries = {e.usage.request_id: e.usage for e in (await page(
            ledger.store, Selection(DAY, DAY + 86400, "team-a"), 10)).entries}
    finally:
        await ledger.close()
    assert {rid: (u.end_user, u.tags) for rid, u in entries.items()} == {
        "old-db": (None, {}), "old-log": (None, {}), "new": ("carol", {"env": "ci"})}
