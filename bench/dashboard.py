"""Dashboard queries on a large ledger: 1,000,000 records over 50 teams and 90 days, in SQLite and in
PostgreSQL (a server started for the run, as the tests start theirs).

    .venv/bin/python bench/dashboard.py [--rows N] [--runs R] [--stores sqlite,postgresql]

Teams are sized unevenly (weight 1/sqrt(rank)): the largest holds ~8% of the rows, the median ~1.5%.
For the largest and the median team it prints, per store, the median and the spread (min..max) over
R runs, with this process's CPU time (the whole cost of a SQLite query, which waiting for a shared core
does not inflate), of: the 90-day overview (tiles, exact p50/p95, daily series by model, breakdowns by model,
key and user) in UTC and in America/New_York; the latest-requests page, first and 50 pages deep by
cursor, next to the same deep page by OFFSET (how list pages are often read, LiteLLM's among them);
the CSV of the team's whole 90 days; the month's statement; and the admin ranking of all 50 teams.
The target is an overview under 300 ms. Other processes share the cores: read the spread and the CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
import structlog

from billing.exports.csv import records_csv
from billing.filters import Selection
from billing.insights.overview import overview
from billing.insights.ranking import team_ranking
from billing.insights.requests import Cursor, page
from billing.statements import monthly_statement
from billing.store import latency_rollup, open_store
from billing.store.base import COLUMNS, ENTRY_COLUMNS, TABLE, row_entry, utc_day
from billing.store.rollups import backfill
from storage.registry import parse
from storage.sql_dialect import PostgresDialect, SqliteDialect
from testkit.servers import postgres_server

DAYS = 90
START = 1_735_689_600.0  # 2025-01-01T00:00:00Z
MODELS = {"small": (100_000, 400_000), "medium": (500_000, 1_500_000), "big": (3_000_000, 15_000_000),
          "code": (800_000, 2_400_000)}
DIALECTS = ("openai", "friendli", "tgi", "sglang", "monster", "datacrunch")
BATCH = 50_000


def team_names(n: int = 50) -> list[str]:
    return [f"team_{i:02d}" for i in range(n)]


def generate(rows: int, seed: int = 7, teams: list[str] | None = None):
    """Rows in `COLUMNS` order, in time order, in batches; keys belong to users (or are service keys),
    and each key mostly calls one model through one dialect, as real clients do. `teams`: theirs (else 50)."""
    rnd = random.Random(seed)
    teams = teams or team_names()
    weights = [1 / math.sqrt(i + 1) for i in range(len(teams))]
    keys = {}
    for team in teams:
        keys[team] = [(f"{team}_key{k}", None if k % 4 == 3 else f"{team}_user{k % 5}", rnd.choice(list(MODELS)),
                       rnd.choice(DIALECTS)) for k in range(12)]
    price_change = START + 45 * 86400  # "big" costs more from day 45: two statement lines that month
    step = DAYS * 86400 / rows
    batch = []
    team_of = rnd.choices(teams, weights, k=rows)
    for i in range(rows):
        t = START + i * step + rnd.random() * step
        team = team_of[i]
        key_id, user_id, model, dialect = rnd.choice(keys[team])
        if rnd.random() < 0.15:
            model = rnd.choice(list(MODELS))
        roll = rnd.random()
        status = "ok" if roll < 0.92 else "cancelled" if roll < 0.94 else "error" if roll < 0.95 else "rejected"
        if status == "rejected":
            prompt = completion = compute = 0
            error_code, error_status = ("rate_limit_exceeded", 429) if rnd.random() < 0.8 else ("invalid_value", 422)
            latency, ttft = rnd.uniform(0.2, 3), None
        else:
            prompt, completion = rnd.randint(20, 4000), rnd.randint(1, 800)
            compute = completion * (4 if rnd.random() < 0.05 else 1)
            error_code, error_status = ("worker_failed", 502) if status == "error" else (None, None)
            latency, ttft = rnd.lognormvariate(6.5, 0.8), rnd.lognormvariate(4.5, 0.7)
        price_in, price_out = MODELS[model]
        if model == "big" and t >= price_change:
            price_in, price_out = price_in * 6 // 5, price_out * 6 // 5
        cost = (prompt * price_in + max(compute, completion) * price_out + 500_000) // 1_000_000
        cold = rnd.uniform(2_000, 40_000) if rnd.random() < 0.01 else None
        # no draw of its own, so the rows are those of the runs before the field; a tenth of the answers are cut
        finish = ("length" if completion % 10 == 0 else "stop") if status == "ok" else \
            None if status == "rejected" else status
        batch.append((f"req_{i:09d}", t, utc_day(t), team, key_id, user_id, model, dialect, "/v1/chat/completions",
                      prompt, completion, compute, status, latency, ttft, "w-1", price_in, price_out, cost, t + 1.0,
                      cold, error_code, error_status, "", finish,
                      # schema 7's client id, schema 8's cached tokens, batch mark, prices and savings, schema 9's
                      # prediction tokens, schema 10's end user and tags: none drawn
                      None, 0, None, None, price_in, 0, 0, 0, 0, 0, None, None))
        if len(batch) == BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


async def build(url: str, rows: int, teams: list[str] | None = None) -> tuple[float, float]:
    """Bulk-loads all but the last batches with the driver itself and fills the rollups from them
    (the migration's own statements), then writes the rest through the store in the shipper's batches
    of 2,000, rollups kept as in production. Returns (build seconds, store insert rows/s)."""
    started = time.perf_counter()
    store = await open_store(url)
    await store.close()
    batches = list(generate(rows, teams=teams))
    bulk, tail = batches[:-1], batches[-1:]
    if url.startswith("sqlite"):
        db = sqlite3.connect(parse(url)[1])
        insert = f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
        for batch in bulk:
            db.executemany(insert, batch)
            db.commit()
        for sql in [*backfill(SqliteDialect()), latency_rollup.backfill_sql(SqliteDialect())]:
            db.execute(sql)
        db.commit()
        db.execute("ANALYZE")
        db.commit()
        db.close()
    else:
        con = await asyncpg.connect(url)
        try:
            for batch in bulk:
                await con.copy_records_to_table(TABLE, records=batch, columns=COLUMNS)
            for sql in [*backfill(PostgresDialect()), latency_rollup.backfill_sql(PostgresDialect())]:
                await con.execute(sql)
        finally:
            await con.close()
    store = await open_store(url)
    try:
        entries = [row_entry(r) for batch in tail for r in batch]
        t = time.perf_counter()
        for i in range(0, len(entries), 2000):
            await store.insert(entries[i:i + 2000])
        rate = len(entries) / (time.perf_counter() - t)
    finally:
        await store.close()
    if not url.startswith("sqlite"):
        con = await asyncpg.connect(url)
        try:
            await con.execute(f"VACUUM ANALYZE {TABLE}")  # what autovacuum does to an insert-only table
        finally:
            await con.close()
    return time.perf_counter() - started, rate


class Timings:
    """Wall milliseconds of each run, and this process's CPU milliseconds (all its threads: for SQLite
    the whole cost of a query, which contention for the cores does not inflate as it does the wall)."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def __str__(self) -> str:
        return (f"{statistics.median(self.wall):8.1f} ms  ({min(self.wall):.1f}..{max(self.wall):.1f})"
                f"  cpu {statistics.median(self.cpu):6.1f} ms")


async def timed(runs: int, fn) -> Timings:
    await fn()  # warm the caches: a dashboard's second view is the common case
    out = Timings()
    for _ in range(runs):
        cpu, wall = time.process_time(), time.perf_counter()
        await fn()
        out.wall.append((time.perf_counter() - wall) * 1000)
        out.cpu.append((time.process_time() - cpu) * 1000)
    return out


async def offset_page(store, team: str, offset: int, limit: int) -> list:
    marks = store.dialect.mark
    return await store.fetch(f"SELECT {ENTRY_COLUMNS} FROM {TABLE} WHERE team_id = {marks(1)} AND time >= {marks(2)} "
                             f"AND time < {marks(3)} ORDER BY time DESC, request_id DESC LIMIT {limit} OFFSET {offset}",
                             [team, START, START + DAYS * 86400])


async def measure(url: str, runs: int) -> None:
    store = await open_store(url)
    window = (START, START + DAYS * 86400)
    try:
        counts = {r.key: r.requests for r in await team_ranking(store, Selection(*window))}
        by_size = sorted(counts, key=counts.get, reverse=True)
        for label, team in (("largest", by_size[0]), ("median", by_size[len(by_size) // 2])):
            sel = Selection(*window, team)
            print(f"  {label} team {team}: {counts[team]} records")
            utc = await timed(runs, lambda sel=sel: overview(store, sel, "day", "UTC"))
            ny = await timed(runs, lambda sel=sel: overview(store, sel, "day", "America/New_York"))
            hours = await timed(runs, lambda sel=sel: overview(store, sel.narrowed(window[1] - 7 * 86400, window[1]),
                                                               "hour", "UTC"))
            print(f"    overview 90 d, daily, UTC             {utc}")
            print(f"    overview 90 d, daily, America/New_York {ny}")
            print(f"    overview 7 d, hourly, UTC              {hours}")
            first = await timed(runs, lambda sel=sel: page(store, sel, 100))
            cursor, depth = None, min(50, counts[team] // 100 - 1)
            for _ in range(depth):
                result = await page(store, sel, 100, cursor)
                cursor = Cursor.decode(result.next_cursor, True)
            deep = await timed(runs, lambda sel=sel, c=cursor: page(store, sel, 100, c))
            by_offset = await timed(runs, lambda team=team, depth=depth: offset_page(store, team, depth * 100, 100))
            print(f"    requests page 1 (100 rows)             {first}")
            print(f"    requests page {depth + 1} by cursor            {deep}")
            print(f"    requests page {depth + 1} by OFFSET            {by_offset}   "
                  f"cursor is {statistics.median(by_offset.wall) / statistics.median(deep.wall):.1f}x faster")

            async def export(sel=sel) -> None:
                async for _ in records_csv(store, sel):
                    pass
            csv_ms = await timed(max(1, runs // 2), export)
            print(f"    CSV of all {counts[team]} records           {csv_ms}   "
                  f"{counts[team] / statistics.median(csv_ms.wall) * 1000:.0f} rows/s")
            statement = await timed(runs, lambda team=team: monthly_statement(store, team, "2025-02"))
            print(f"    statement 2025-02                      {statement}")
        ranking = await timed(runs, lambda: team_ranking(store, Selection(*window)))
        print(f"  admin ranking of {len(counts)} teams, 90 d        {ranking}")
    finally:
        await store.close()


async def run(url: str, rows: int, runs: int, *, build_it: bool = True) -> None:
    print(f"[{url.split(':', 1)[0]}] {'building' if build_it else 'reusing'} {rows} records ...", flush=True)
    if build_it:
        seconds, rate = await build(url, rows)
        print(f"  built in {seconds:.1f} s; the store's insert, rollups kept, takes {rate:.0f} records/s")
    await measure(url, runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--stores", default="sqlite,postgresql")
    parser.add_argument("--sqlite-file", type=Path, help="keep the SQLite ledger here and reuse it when it exists")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    stores = args.stores.split(",")
    assert set(stores) <= {"sqlite", "postgresql"}, "stores: sqlite, postgresql"
    with tempfile.TemporaryDirectory(prefix="sluice-bench-dashboard-") as tmp:
        if "sqlite" in stores:
            path = args.sqlite_file or Path(tmp) / "billing.db"
            asyncio.run(run(f"sqlite:///{path}", args.rows, args.runs, build_it=not path.exists()))
        if "postgresql" in stores:
            with postgres_server() as server:
                asyncio.run(run(server.url, args.rows, args.runs))


if __name__ == "__main__":
    main()
