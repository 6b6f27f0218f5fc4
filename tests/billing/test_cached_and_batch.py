"""Cached prompt tokens and batch lines in the ledger (billing migration 8), on SQLite and PostgreSQL: the price
of a record (cached-input price for the prefix cache's tokens, the batch discount for a record with a batch mark,
exact integers), what each saved against the list prices, the pricing file's new fields and their bounds, log
entries written before them, a version-7 database migrated with its records, and every view that sums them (the
overview from rollups and records, the usage API, statements, the CSV and S3 exports)."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import random
from datetime import date
from fractions import Fraction

import msgspec
import pytest

import storage
from billing.exports.csv import RECORD_FIELDS, csv_text, records_csv, report_csv, statement_csv
from billing.exports.s3 import export_day
from billing.filters import Selection
from billing.insights.overview import overview
from billing.ledger import Ledger
from billing.pricing import PricingError, PricingTable, parse_prices
from billing.records import LedgerEntry, Price
from billing.statements import monthly_statement
from billing.store import rollups
from billing.store.base import COLUMNS, TABLE
from billing.store.schema import SCHEMA
from billing.usage import UsageQuery
from billing.wal import frame, segment_path
from storage import Schema
from storage.sql_dialect import PostgresDialect, SqliteDialect
from tests.billing.factory import usage
from tests.billing.http import ts

# $1 in, $0.25 cached in, $4 out per million tokens; batch lines at half price
PRICE = Price(1_000_000, 4_000_000, 250_000, 50)
PRICES = {"small": PRICE, "big": Price(3_000_000, 15_000_000)}  # big: no cached price, no batch discount
DAY = ts("2025-03-10")


def _round(amount: Fraction) -> int:
    return math.floor(amount + Fraction(1, 2))  # half up


@pytest.mark.parametrize(("prompt", "output", "cached", "batch", "charged"), [
    (1000, 100, 0, False, (1400, 0, 0)),  # the list price
    (1000, 100, 800, False, (800, 600, 0)),  # 200 at $1, 800 at $0.25, 100 at $4
    (1000, 100, 0, True, (700, 0, 700)),  # half of the list price
    (1000, 100, 800, True, (400, 600, 400)),  # half of the cached price
    (3, 1, 1, True, (3, 1, 3)),  # 6.25 micros cached, 3.125 for batch: each rounded once, half up
    (10, 0, 50, False, (3, 7, 0)),  # never more of the prompt cached than the prompt: 10 × $0.25 = 2.5 → 3
])
def test_a_records_cost_and_what_it_saved(prompt, output, cached, batch, charged):
    charge = PRICE.charge(prompt, output, cached_tokens=cached, batch=batch)
    assert (charge.cost_micros, charge.cache_saved_micros, charge.batch_saved_micros) == charged
    assert sum(charged) == PRICE.cost(prompt, output)  # cost + savings = the list cost, to the micro-unit


def test_the_arithmetic_is_exact_and_the_savings_never_negative():
    rng = random.Random(8)
    for _ in range(3000):
        price = Price(rng.randrange(0, 10**8), rng.randrange(0, 10**8), None, rng.randrange(0, 101))
        price = msgspec.structs.replace(price, cached_input_micros=rng.randrange(0, price.input_micros + 1))
        prompt, output, batch = rng.randrange(0, 10**6), rng.randrange(0, 10**5), rng.random() < 0.5
        cached = rng.randrange(0, prompt + 1)
        charge = price.charge(prompt, output, cached_tokens=cached, batch=batch)
        exact = Fraction((prompt - cached) * price.input_micros + cached * price.cached_micros
                         + output * price.output_micros, 10**6)
        assert charge.cost_micros == _round(exact * (100 - (price.batch_discount_percent if batch else 0)) / 100)
        assert charge.cache_saved_micros >= 0 and charge.batch_saved_micros >= 0
        assert charge.cost_micros + charge.cache_saved_micros + charge.batch_saved_micros == price.cost(prompt, output)


def test_the_pricing_file_takes_a_cached_price_and_a_batch_discount():
    doc = {"models": {"small": {"input": 100, "output": 400, "cached_input": 25, "batch_discount_percent": 50},
                      "big": {"input": 7, "output": 9}}}
    assert parse_prices(doc) == {"small": Price(100, 400, 25, 50), "big": Price(7, 9, None, 0)}
    assert parse_prices(doc)["big"].cached_micros == 7  # no cached price: the input price


@pytest.mark.parametrize(("entry", "named"), [
    ({"input": 100, "cached_input": 101}, "cached_input"),  # a cached token dearer than a prefilled one
    ({"cached_input": 1}, "cached_input"),  # above an input price of 0
    ({"input": 100, "cached_input": -1}, "cached_input"),
    ({"input": 100, "cached_input": 2.5}, "cached_input"),
    ({"input": 100, "cached_input": True}, "cached_input"),
    ({"input": 10**15 + 1}, "input"),  # past any real price: a typo
    ({"output": 10**16}, "output"),
    ({"batch_discount_percent": 101}, "batch_discount_percent"),
    ({"batch_discount_percent": -1}, "batch_discount_percent"),
    ({"batch_discount_percent": 50.0}, "batch_discount_percent"),
    ({"batch_discount_percent": "50%"}, "batch_discount_percent"),
    ({"batch_discount_percent": False}, "batch_discount_percent"),
    ({"batch_price": 1}, "batch_price"),  # unknown: it would price nothing
])
def test_a_bad_cached_or_batch_price_is_refused_naming_it(entry, named):
    with pytest.raises(PricingError, match=rf"models\.small.*{named}") as refused:
        parse_prices({"models": {"small": entry}})
    assert "\n" not in str(refused.value)  # one line, as the gateway's start-up prints it


def test_a_bad_file_is_refused_when_read(tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text("[pricing.models.small]\ninput = 10\noutput = 20\nbatch_discount_percent = 150\n")
    with pytest.raises(PricingError, match="batch_discount_percent must be a whole percentage from 0 to 100"):
        PricingTable(path, section="pricing")


async def _ledger(database_url, wal_dir) -> Ledger:
    return await Ledger.open(database_url, wal_dir, PricingTable.static(PRICES))


def _records():
    """Team A on two days of March: interactive, cached, batch lines (one cached), a refusal, another model."""
    mark = {"batch_id": "batch_abc", "custom_id": "line-1"}
    return [usage(request_id="plain", time=DAY + 600, prompt_tokens=1000, completion_tokens=100, compute_tokens=100),
            usage(request_id="cached", time=DAY + 3600, prompt_tokens=1000, completion_tokens=100,
                  compute_tokens=100, cached_tokens=800),
            usage(request_id="batch-cached", time=DAY + 7200, prompt_tokens=1000, completion_tokens=100,
                  compute_tokens=100, cached_tokens=800, **mark),
            usage(request_id="batch-next-day", time=DAY + 86400 + 43200, prompt_tokens=2000, completion_tokens=50,
                  compute_tokens=50, batch_id="batch_abc", custom_id="line-2"),
            usage(request_id="refused", time=DAY + 900, status="rejected", prompt_tokens=0, completion_tokens=0,
                  compute_tokens=0, cached_tokens=5, error_code="rate_limit_exceeded", error_status=429),
            usage(request_id="over-cached", time=DAY + 1200, model="big", prompt_tokens=40, completion_tokens=2,
                  compute_tokens=2, cached_tokens=64),
            usage(request_id="long-ids", time=DAY + 1500, prompt_tokens=1, completion_tokens=1, compute_tokens=1,
                  batch_id="b" * 300, custom_id="c" * 400)]


async def test_cached_tokens_and_batch_lines_are_priced_stored_and_summed(database_url, wal_dir, s3, tmp_path):
    ledger = await _ledger(database_url, wal_dir)
    try:
        for record in _records():
            await ledger.record(record)
        await ledger.flush(10)
        entries = {e.usage.request_id: e for e in await ledger.records(UsageQuery(start=0.0, end=4e9))}
        priced = {rid: (e.usage.cached_tokens, e.usage.batch_id, e.cost_micros, e.cache_saved_micros,
                        e.batch_saved_micros, e.cached_input_price_micros, e.batch_discount_percent)
                  for rid, e in entries.items() if rid != "long-ids"}
        assert priced == {
            "plain": (0, None, 1400, 0, 0, 250_000, 50), "cached": (800, None, 800, 600, 0, 250_000, 50),
            "batch-cached": (800, "batch_abc", 400, 600, 400, 250_000, 50),
            "batch-next-day": (0, "batch_abc", 1100, 0, 1100, 250_000, 50),  # (2000 × $1 + 50 × $4) / 2
            "refused": (0, None, 0, 0, 0, 250_000, 50),  # a refusal carries no tokens, cached ones neither
            "over-cached": (40, None, 150, 0, 0, 3_000_000, 0)}  # cut to the prompt; big has no cached price
        assert entries["batch-cached"].usage.custom_id == "line-1"
        cut = entries["long-ids"].usage
        assert (len(cut.batch_id), len(cut.custom_id), cut.batch_id[-1], cut.custom_id[:3]) == (128, 256, "…", "ccc")

        # the overview: whole days from the rollups, the partial ones at the edges from the records, alike
        batch_lines = [e for e in entries.values() if e.usage.batch_id]
        for start, end in ((DAY, DAY + 2 * 86400), (DAY + 1000, DAY + 86400 + 50000), (DAY + 1000, DAY + 86400)):
            inside = [e for e in entries.values() if start <= e.usage.time < end]
            totals = (await overview(ledger.store, Selection(start, end, "team-a"))).totals
            assert (totals.cached_tokens, totals.batch_requests, totals.batch_cost_micros, totals.cache_saved_micros,
                    totals.batch_saved_micros, totals.cost_micros) == (
                sum(e.usage.cached_tokens for e in inside), sum(1 for e in inside if e.usage.batch_id),
                sum(e.cost_micros for e in inside if e.usage.batch_id), sum(e.cache_saved_micros for e in inside),
                sum(e.batch_saved_micros for e in inside), sum(e.cost_micros for e in inside))
        # the usage API's rows carry them, by hour (the hourly rollup), by day and by model
        for group_by in ("hour", "day", "model"):
            report = await ledger.usage(UsageQuery(DAY, DAY + 2 * 86400, "team-a", group_by))
            assert (report.totals.cached_tokens, report.totals.batch_cost_micros, report.totals.batch_requests) == (
                1640, sum(e.cost_micros for e in batch_lines), 3), group_by

        # the statement: batch lines apart from interactive ones, each with its prices and savings
        statement = await monthly_statement(ledger.store, "team-a", "2025-03")
        lines = {(line.model, line.batch): line for line in statement.lines}
        assert [(m, b, x.requests, x.cached_tokens, x.cost_micros, x.cache_saved_micros, x.batch_saved_micros)
                for (m, b), x in sorted(lines.items())] == [
            ("big", False, 1, 40, 150, 0, 0), ("small", False, 3, 800, 2200, 600, 0),
            ("small", True, 3, 800, 1500 + entries["long-ids"].cost_micros, 600,
             1500 + entries["long-ids"].batch_saved_micros)]
        assert (lines["small", True].cached_input_price_micros, lines["small", True].batch_discount_percent) == (
            250_000, 50)
        assert statement.total_micros == sum(e.cost_micros for e in entries.values())
        assert statement.batch_micros == sum(e.cost_micros for e in batch_lines)
        rows = list(csv.DictReader(io.StringIO(statement_csv(statement))))
        assert rows[-2]["model"] == "of which batch" and int(rows[-2]["cost_micros"]) == statement.batch_micros
        assert int(rows[-1]["cached_tokens"]) == 1640 and int(rows[-1]["cache_saved_micros"]) == 1200

        # the records' CSV and the S3 export name every new field
        text = "".join([chunk async for chunk in records_csv(ledger.store, Selection(DAY, DAY + 86400, "team-a"))])
        by_id = {row["request_id"]: row for row in csv.DictReader(io.StringIO(text))}
        assert {"cached_tokens", "batch_id", "custom_id", "cached_input_price_micros", "batch_discount_percent",
                "cache_saved_micros", "batch_saved_micros"} <= set(RECORD_FIELDS)
        assert {k: by_id["batch-cached"][k] for k in ("cached_tokens", "batch_id", "custom_id", "cost_micros",
                                                       "cache_saved_micros", "batch_saved_micros")} == {
            "cached_tokens": "800", "batch_id": "batch_abc", "custom_id": "line-1", "cost_micros": "400",
            "cache_saved_micros": "600", "batch_saved_micros": "400"}
        summed = list(csv.reader(io.StringIO(report_csv(await ledger.usage(UsageQuery(DAY, DAY + 86400, "team-a",
                                                                                      "none")), "none"))))
        assert summed[0][-6:] == ["cached_tokens", "batch_requests", "batch_cost_micros", "cache_saved_micros",
                                  "batch_saved_micros", "cost"]
        s3.create_bucket(Bucket="cached-batch")
        await export_day(ledger.store, s3, "cached-batch", date(2025, 3, 10), team_ids=["team-a"])
        body = s3.get_object(Bucket="cached-batch", Key="team-a/2025-03-10.jsonl.gz")["Body"].read()
        exported = {line["request_id"]: line for line in map(json.loads, gzip.decompress(body).splitlines())}
        assert exported["batch-cached"] == entries["batch-cached"].flat()
        assert (exported["batch-cached"]["batch_id"], exported["cached"]["cached_tokens"]) == ("batch_abc", 800)
    finally:
        await ledger.close()


def _schema_7_frame(request_id: str) -> bytes:
    """A log entry as a gateway of schema 7 wrote it: 21 record fields (the last the client's request id), five of
    the entry; no cached tokens, batch mark or savings."""
    record = [request_id, DAY + 60, "team-a", "key-0", None, "small", "openai", "/v1/completions", 100, 10, 10, "ok",
              12.0, 2.0, "w-1", None, None, None, "", "stop", "client-7"]
    return frame(msgspec.msgpack.encode([record, 1_000_000, 4_000_000, 140, 1.7e9]))


async def test_a_log_written_before_schema_8_replays_beside_new_entries(database_url, wal_dir):
    wal_dir.mkdir()
    new = usage(request_id="new-1", time=DAY + 120, cached_tokens=3, batch_id="batch_1", custom_id="x")
    new_frame = frame(msgspec.msgpack.encode(LedgerEntry(new, 1_000_000, 4_000_000, 5, 1.7e9, 250_000, 50, 1, 6)))
    segment_path(wal_dir, 1).write_bytes(_schema_7_frame("old-1") + new_frame + _schema_7_frame("old-2"))
    ledger = await _ledger(database_url, wal_dir)
    try:
        entries = {e.usage.request_id: e for e in await ledger.records(UsageQuery(start=0.0, end=4e9))}
        totals = (await overview(ledger.store, Selection(DAY, DAY + 86400, "team-a"))).totals
    finally:
        await ledger.close()
    assert {rid: (e.usage.client_request_id, e.usage.cached_tokens, e.usage.batch_id, e.usage.custom_id,
                  e.cost_micros, e.cached_input_price_micros, e.cache_saved_micros, e.batch_saved_micros)
            for rid, e in entries.items()} == {
        "old-1": ("client-7", 0, None, None, 140, None, 0, 0), "old-2": ("client-7", 0, None, None, 140, None, 0, 0),
        "new-1": (None, 3, "batch_1", "x", 5, 250_000, 1, 6)}
    assert (totals.cost_micros, totals.cached_tokens, totals.batch_cost_micros, totals.batch_saved_micros) == (
        285, 3, 5, 6)


async def _write_version_7(database_url: str) -> None:
    """A billing database as a schema-7 gateway left it: its records (26 columns) and rollups of them."""
    db = await storage.open(database_url)
    try:
        await storage.migrate(db, Schema("billing", SCHEMA.migrations[:7], legacy_table=SCHEMA.legacy_table))
        v7 = COLUMNS[:26]
        rows = [(f"old-{i}", DAY + i * 3600.0, "2025-03-10", "team-a", "key-1", None, "small", "openai",
                 "/v1/completions", 100 * i, i, i, "ok", 10.0, 1.0, "w-1", 1_000_000, 4_000_000, 104 * i, 1.7e9, None,
                 None, None, "", "stop", None) for i in range(1, 13)]
        dialect = PostgresDialect() if db.dialect == "postgres" else SqliteDialect()
        async with db.transaction() as tx:
            await tx.executemany(f"INSERT INTO {TABLE} ({', '.join(v7)}) VALUES ({', '.join('?' * len(v7))})", rows)
            # schema 6's rollups, as its gateways kept them
            await tx.execute(rollups._backfill(dialect, rollups.DAILY, rollups._DAILY_KEY_V3, rollups._DAILY_SUMS_V6,
                                               rollups.DAY))
            await tx.execute(rollups._backfill(dialect, rollups.HOURLY, rollups.HOURLY_KEY, rollups._HOURLY_SUMS_V6,
                                               rollups.HOUR))
    finally:
        await db.close()


async def test_migration_8_upgrades_a_version_7_database_with_its_records(database_url, wal_dir):
    await _write_version_7(database_url)
    # a gateway of schema 8 whose file names no cached price: the new records pay the input price for cached tokens,
    # and share a statement line with the old ones
    ledger = await Ledger.open(database_url, wal_dir, PricingTable.static({"small": Price(1_000_000, 4_000_000)}))
    try:
        await ledger.record(usage(request_id="new", time=DAY + 13 * 3600, prompt_tokens=500, completion_tokens=5,
                                  compute_tokens=5, cached_tokens=100))
        await ledger.record(usage(request_id="new-batch", time=DAY + 14 * 3600, prompt_tokens=7, completion_tokens=1,
                                  compute_tokens=1, batch_id="batch_9", custom_id="a"))
        await ledger.flush(10)
        applied = await ledger.store.fetch("SELECT version FROM schema_migrations WHERE package = 'billing' "
                                           "ORDER BY version", [])
        entries = {e.usage.request_id: e for e in await ledger.records(UsageQuery(start=0.0, end=4e9))}
        totals = (await overview(ledger.store, Selection(DAY, DAY + 86400, "team-a"))).totals  # the daily rollup
        statement = await monthly_statement(ledger.store, "team-a", "2025-03")
    finally:
        await ledger.close()
    assert [v for (v,) in applied] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    old = entries["old-5"]
    assert (old.usage.prompt_tokens, old.cost_micros, old.usage.cached_tokens, old.usage.batch_id,
            old.cached_input_price_micros, old.cache_saved_micros) == (500, 520, 0, None, None, 0)
    assert totals.requests == 14 and totals.cost_micros == sum(e.cost_micros for e in entries.values())
    assert (totals.cached_tokens, totals.batch_requests) == (100, 1)
    assert [(line.batch, line.requests, line.cached_input_price_micros) for line in statement.lines] == [
        (False, 13, 1_000_000), (True, 1, 1_000_000)]


def test_csv_cells_of_the_new_fields_stay_plain():
    assert csv_text([["batch_abc", "=cmd", 0]]) == "batch_abc,'=cmd,0\r\n"  # a caller's custom_id is text
