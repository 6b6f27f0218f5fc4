"""Monthly statements: a line per model and price, at the price each request ran at; totals equal the
usage API to the micro-unit; the CSV is the JSON."""

from __future__ import annotations

import csv
import io

import pytest

from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.records import Price
from billing.statements import month_window, monthly_statement
from tests.billing.factory import usage
from tests.billing.http import auth, ts, usage_client

MARCH = {"big": Price(3_000_000, 15_000_000), "small": Price(100_000, 400_000)}
RAISED = {"big": Price(3_600_000, 18_000_000), "small": Price(100_000, 400_000)}


@pytest.fixture
async def priced_ledger(database_url, wal_dir):
    # the operator raised the price of "big" on March 16th (a new pricing file, a restart): the records
    # carry the prices they were billed at
    before = [usage(team_id="team-a", model="big", time=ts("2025-03-01T00:00:00"), prompt_tokens=1000,
                    completion_tokens=100, compute_tokens=400),
              usage(team_id="team-a", model="big", time=ts("2025-03-15T23:59:59"), prompt_tokens=333,
                    completion_tokens=77, compute_tokens=77),
              usage(team_id="team-a", model="small", time=ts("2025-03-10T10:00:00"), prompt_tokens=5,
                    completion_tokens=9, compute_tokens=3),
              usage(team_id="team-a", model="big", time=ts("2025-02-28T23:59:59"), prompt_tokens=10 ** 6),
              usage(team_id="team-b", model="big", time=ts("2025-03-05T00:00:00"), prompt_tokens=10 ** 6)]
    after = [usage(team_id="team-a", model="big", time=ts("2025-03-16T00:00:00"), prompt_tokens=1000,
                   completion_tokens=100, compute_tokens=400),
             usage(team_id="team-a", model="big", time=ts("2025-03-31T23:59:59.999"), prompt_tokens=1,
                   completion_tokens=1, compute_tokens=1, status="cancelled"),
             usage(team_id="team-a", model="big", time=ts("2025-03-20T00:00:00"), status="rejected", prompt_tokens=0,
                   completion_tokens=0, compute_tokens=0),
             usage(team_id="team-a", model="big", time=ts("2025-04-01T00:00:00"), prompt_tokens=10 ** 6)]
    for prices, records in ((MARCH, before), (RAISED, after)):
        ledger = await Ledger.open(database_url, wal_dir, PricingTable.static(prices))
        for r in records:
            await ledger.record(r)
        await ledger.close()
    ledger = await Ledger.open(database_url, wal_dir, PricingTable.static(RAISED))
    yield ledger
    await ledger.close()


async def test_a_price_change_gives_two_lines(priced_ledger):
    statement = await monthly_statement(priced_ledger.store, "team-a", "2025-03")
    lines = [(x.model, x.input_price_micros, x.output_price_micros, x.requests, x.prompt_tokens, x.output_tokens,
              x.first_day, x.last_day) for x in statement.lines]
    assert lines == [
        ("big", 3_000_000, 15_000_000, 2, 1333, 477, "2025-03-01", "2025-03-15"),
        ("big", 3_600_000, 18_000_000, 3, 1001, 401, "2025-03-16", "2025-03-31"),
        ("small", 100_000, 400_000, 1, 5, 9, "2025-03-10", "2025-03-10")]  # output: completion beat compute
    # each line's amount is its requests' costs, each rounded when the ledger priced it
    assert [x.cost_micros for x in statement.lines] == [
        (1000 * 3_000_000 + 400 * 15_000_000 + 500_000) // 10**6
        + (333 * 3_000_000 + 77 * 15_000_000 + 500_000) // 10**6,
        (1000 * 3_600_000 + 400 * 18_000_000 + 500_000) // 10**6 + (1 * 3_600_000 + 1 * 18_000_000 + 500_000) // 10**6,
        (5 * 100_000 + 9 * 400_000 + 500_000) // 10**6]
    assert statement.total_micros == sum(x.cost_micros for x in statement.lines)
    assert statement.total == f"{statement.total_micros // 10**6}.{statement.total_micros % 10**6:06d}"
    assert (statement.start, statement.end) == (ts("2025-03-01"), ts("2025-04-01"))


async def test_statement_total_equals_usage_api_and_csv_equals_json(priced_ledger):
    async with usage_client(priced_ledger) as client:
        usage_api = (await client.get("/v1/usage", params={"start": "2025-03-01", "end": "2025-03-31",
                                                           "group_by": "none"}, headers=auth("a"))).json()
        as_json = (await client.get("/v1/usage/statement", params={"month": "2025-03"}, headers=auth("a"))).json()
        as_csv = await client.get("/v1/usage/statement", params={"month": "2025-03", "format": "csv"},
                                  headers=auth("a"))
        admin = (await client.get("/admin/usage/statement", params={"month": "2025-03", "team_id": "team-a"},
                                  headers=auth("root"))).json()
    assert as_json["total_micros"] == usage_api["totals"]["cost_micros"]
    assert as_json["total"] == usage_api["totals"]["cost"]
    assert admin == as_json
    assert as_csv.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [{k: str(v) for k, v in line.items()} for line in as_json["lines"]] == rows[:-2]
    assert rows[-2]["model"] == "of which batch" and int(rows[-2]["cost_micros"]) == as_json["batch_micros"] == 0
    assert rows[-1]["model"] == "total" and int(rows[-1]["cost_micros"]) == as_json["total_micros"]
    assert int(rows[-1]["requests"]) == sum(line["requests"] for line in as_json["lines"])


async def test_an_empty_month_has_no_lines(priced_ledger):
    statement = await monthly_statement(priced_ledger.store, "team-a", "2024-12")
    assert (statement.lines, statement.total_micros, statement.total) == ([], 0, "0.000000")


@pytest.mark.parametrize("month", ["2025-3", "2025-00", "2025-13", "25-03", "1969-12", "2025-03-01", ""])
def test_bad_months_are_refused(month):
    with pytest.raises(ValueError):
        month_window(month)
