"""Per-batch spend (the dashboard's Batches page) from the ledger, on SQLite and PostgreSQL: each batch's cost and
what the batch rate and the prefix cache saved equal the sums of its lines' own charges to the micro-dollar; a
record of another team naming the same batch id, an interactive record and a record from before the batch are not
counted (billing/insights/batch_spend.py)."""

from __future__ import annotations

import time

import pytest

from billing.insights.batch_spend import MAX_BATCHES, BatchSpend, batch_spend
from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.records import Price
from tests.billing.factory import usage

PRICE = Price(1_000_000, 4_000_000, 250_000, 50)  # $1 in, $0.25 cached in, $4 out a million; batch lines half


@pytest.fixture
async def priced_ledger(database_url, wal_dir):
    ledger = await Ledger.open(database_url, wal_dir, PricingTable.static({"small": PRICE, "default": PRICE}))
    yield ledger
    await ledger.close()


async def test_each_batch_sums_its_own_lines_exactly(priced_ledger):
    since = time.time() - 60
    lines = {"batch_a": [(1003, 17, 801), (3, 1, 1), (999_999, 12_345, 0)], "batch_b": [(7, 3, 0)]}
    records = [usage(team_id="team-a", batch_id=batch_id, custom_id=f"c{n}", prompt_tokens=prompt,
                     completion_tokens=output, compute_tokens=output, cached_tokens=cached, time=since + 1)
               for batch_id, charged in lines.items() for n, (prompt, output, cached) in enumerate(charged)]
    records += [usage(team_id="team-b", batch_id="batch_a", custom_id="x", prompt_tokens=10**6),  # another team's
                usage(team_id="team-a", prompt_tokens=10**6),  # interactive
                usage(team_id="team-a", batch_id="batch_a", custom_id="old", prompt_tokens=10**6, time=since - 1)]
    for record in records:
        await priced_ledger.record(record)
    await priced_ledger.flush(10)

    spend = await batch_spend(priced_ledger.store, "team-a", ["batch_a", "batch_b", "batch_none"], since)
    for batch_id, charged in lines.items():
        charges = [PRICE.charge(p, o, cached_tokens=c, batch=True) for p, o, c in charged]
        assert spend[batch_id] == BatchSpend(records=len(charged), cost_micros=sum(c.cost_micros for c in charges),
                                             batch_saved_micros=sum(c.batch_saved_micros for c in charges),
                                             cache_saved_micros=sum(c.cache_saved_micros for c in charges),
                                             cached_tokens=sum(c for _, _, c in charged))
    assert "batch_none" not in spend
    assert await batch_spend(priced_ledger.store, "team-c", ["batch_a"], since) == {}  # no team reads another's
    assert await batch_spend(priced_ledger.store, "team-a", [], since) == {}
    with pytest.raises(ValueError):
        await batch_spend(priced_ledger.store, "team-a", ["b"] * (MAX_BATCHES + 1), since)
