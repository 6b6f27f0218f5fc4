"""Prices from TOML, changed without a restart; a request pays the price in force when it arrived."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from billing.ledger import Ledger
from billing.pricing import PricingError, PricingTable
from billing.records import Price
from billing.usage import UsageQuery
from tests.billing.factory import usage

V1 = """
[models.small]
input = 100000
output = 400000
[models.default]
input = 5
output = 7
"""
V2 = """
[models.small]
input = 200000
output = 800000
"""


def write(path, text):
    path.write_text(text)
    os.utime(path, ns=(time.time_ns(), time.time_ns()))  # a distinct stamp even within one tick


def test_loads_models_and_default(tmp_path):
    path = tmp_path / "pricing.toml"
    write(path, V1)
    table = PricingTable(path)
    assert table.price("small") == Price(100_000, 400_000)
    assert table.price("anything-else") == Price(5, 7)


def test_unknown_model_without_default_is_free():
    assert PricingTable.static({"small": Price(1, 2)}).price("other") == Price(0, 0)


def test_section_of_a_larger_config(tmp_path):
    path = tmp_path / "sluice.toml"
    write(path, "[server]\nport = 1\n[pricing.models.small]\ninput = 3\noutput = 4\n")
    assert PricingTable(path, section="pricing").price("small") == Price(3, 4)


@pytest.mark.parametrize("body", ["[models.small]\ninput = 3\n",  # the prices outside [pricing]
                                  "[server]\nport = 1\n",  # no prices at all
                                  "[pricing.model.small]\ninput = 3\n",  # a misspelt table
                                  "[pricing.models]\n"])  # an empty one
def test_a_section_that_would_price_everything_at_zero_is_refused(tmp_path, body):
    path = tmp_path / "sluice.toml"
    write(path, body)
    with pytest.raises(PricingError, match=r"\[pricing"):
        PricingTable(path, section="pricing")


@pytest.mark.parametrize("body", ["[models.x]\ninput = 1.5\n", "[models.x]\ninput = -1\n",
                                  "[models.x]\ninput = true\n", "[models.x]\nprice = 1\n", "models = 3\n",
                                  "[models\n"])
def test_bad_files_are_refused_at_start(tmp_path, body):
    path = tmp_path / "pricing.toml"
    write(path, body)
    with pytest.raises((PricingError, ValueError)):
        PricingTable(path)


def test_change_is_picked_up_without_restart_and_bad_edit_keeps_last_good(tmp_path):
    path = tmp_path / "pricing.toml"
    write(path, V1)
    table = PricingTable(path, check_interval=0)
    write(path, V2)
    assert table.price("small") == Price(200_000, 800_000)
    assert table.price("other") == Price(0, 0)  # V2 has no default
    write(path, "[models.small]\ninput = 'lots'\n")
    assert table.price("small") == Price(200_000, 800_000)


def test_price_in_force_at_request_time(tmp_path):
    path = tmp_path / "pricing.toml"
    write(path, V1)
    table = PricingTable(path, check_interval=0)
    before = time.time()
    time.sleep(0.01)
    write(path, V2)
    assert table.price("small") == Price(200_000, 800_000)
    # a request that arrived before the edit and finishes after it pays the old price
    assert table.price("small", at=before) == Price(100_000, 400_000)
    assert table.price("small", at=time.time()) == Price(200_000, 800_000)


async def test_ledger_records_the_price_in_force(database_url, wal_dir, tmp_path):
    path = tmp_path / "pricing.toml"
    write(path, V1)
    ledger = await Ledger.open(database_url, wal_dir, PricingTable(path, check_interval=0))
    try:
        early = usage(time=time.time(), prompt_tokens=1_000_000, compute_tokens=1_000_000)
        await ledger.record(early)
        started_before_edit = usage(time=time.time(), prompt_tokens=10, compute_tokens=10)
        await asyncio.sleep(0.01)
        write(path, V2)  # the operator edits prices while the gateway runs
        late = usage(time=time.time(), prompt_tokens=1_000_000, compute_tokens=1_000_000)
        await ledger.record(late)
        await ledger.record(started_before_edit)
        await ledger.flush(10)
        got = {e.usage.request_id: e for e in await ledger.records(UsageQuery(start=0, end=4e9))}
        assert (got[early.request_id].input_price_micros, got[early.request_id].cost_micros) == (100_000, 500_000)
        assert (got[late.request_id].input_price_micros, got[late.request_id].cost_micros) == (200_000, 1_000_000)
        assert got[started_before_edit.request_id].output_price_micros == 400_000
    finally:
        await ledger.close()
