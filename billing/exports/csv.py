"""CSV renderings of the usage views: each has the JSON's rows and values, in the same order, plus a
decimal `cost` column for people. Record listings stream page by page, so an export of any window
holds one page in memory.

Every cell goes through `safe_cell` (by `csv_text`, the one writer): text a tenant chose (a model name, a key's
name) that a spreadsheet would run as a formula is written as text instead."""

from __future__ import annotations

import csv
import io
import re
import unicodedata
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec

from billing.filters import Selection
from billing.insights.requests import every_page
from billing.records import LedgerEntry, UsageRecord
from billing.statements import Statement
from billing.store.base import UsageStore, tags_text
from billing.usage import UsageReport, UsageRow, micros_to_decimal

_ROW_FIELDS = UsageRow.__struct_fields__[1:]  # requests ... cost_micros, then cached tokens, batch spend, savings
RECORD_FIELDS: tuple[str, ...] = (*UsageRecord.__struct_fields__, *LedgerEntry.__struct_fields__[1:])
_LINE_FIELDS = ("model", "input_price_micros", "output_price_micros", "requests", "prompt_tokens", "output_tokens",
                "cost_micros", "cost", "first_day", "last_day", "cached_input_price_micros", "batch_discount_percent",
                "batch", "cached_tokens", "cache_saved_micros", "batch_saved_micros")


# What spreadsheets read as the start of a formula (OWASP's "CSV injection" list). A plain number (our decimal
# cost strings, "-1.500000") is no formula and stays a number; nor is a lone "-", the breakdowns' "none" key.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_NO_FORMULA = re.compile(r"-|-?[0-9]+(\.[0-9]+)?")
# Spreadsheets skip leading blanks and invisible characters before a formula and read fullwidth `＝` as `=`, so
# a cell is judged after those (whitespace of any script, controls, format characters such as ZWSP and BOM).
_SKIPPED = frozenset(("Zs", "Zl", "Zp", "Cc", "Cf"))
_PLAIN_ASCII = frozenset(chr(c) for c in range(0x21, 0x7F)) - set("=+-@")


def _formula_head(text: str) -> str:
    """`text` as a spreadsheet reads its start: leading blank, control and format characters dropped, the
    first visible character in its NFKC form (`＝` is `=`)."""
    start = 0
    while start < len(text) and (text[start].isspace() or unicodedata.category(text[start]) in _SKIPPED):
        start += 1
    return unicodedata.normalize("NFKC", text[start:start + 1]) + text[start + 1:]


def safe_cell(value: Any) -> Any:
    """`value`, with a text cell that a spreadsheet would evaluate led by `'` (shown as text, not run);
    numbers, text that is a plain number, and "-" as they are."""
    if not isinstance(value, str) or not value or value[0] in _PLAIN_ASCII:
        return value  # the common cell: nothing to skip and no formula sign first
    if value.startswith(_FORMULA_START) and not _NO_FORMULA.fullmatch(value):
        return "'" + value
    head = _formula_head(value)
    if head != value and head.startswith(_FORMULA_START[:4]) and not _NO_FORMULA.fullmatch(head):
        return "'" + value
    return value


def csv_text(rows: Iterable[Iterable[Any]]) -> str:
    """The one CSV writer of the project: every cell through `safe_cell`. Rows end in CRLF (RFC 4180), which
    also makes the writer quote a cell holding a lone CR (with "\\n" it did not, and a reader that ends rows at
    a CR saw a row the tenant wrote)."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerows([safe_cell(cell) for cell in row] for row in rows)
    return out.getvalue()


def report_csv(report: UsageReport, group_by: str) -> str:
    """The usage API's rows (`GET /admin/usage?format=csv`)."""
    return csv_text([[group_by, *_ROW_FIELDS, "cost"],
                     *([r.key, *(getattr(r, f) for f in _ROW_FIELDS), micros_to_decimal(r.cost_micros)]
                       for r in report.rows)])


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat()


def _record_row(entry: LedgerEntry) -> list[Any]:
    # RECORD_FIELDS' order: `LedgerEntry.flat()` without building the dict; the tags (last) as their JSON text
    usage = msgspec.structs.astuple(entry.usage)
    return [*usage[:-1], tags_text(entry.usage.tags) or "{}", *msgspec.structs.astuple(entry)[1:],
            _iso(entry.usage.time), micros_to_decimal(entry.cost_micros)]


async def records_csv(store: UsageStore, selection: Selection, *, newest_first: bool = False,
                      page_size: int = 2000) -> AsyncIterator[str]:
    """Every record of the view as CSV text, one chunk per page (a streamed response body)."""
    yield csv_text([[*RECORD_FIELDS, "time_utc", "cost"]])
    async for entries in every_page(store, selection, page_size, newest_first=newest_first):
        yield csv_text(_record_row(e) for e in entries)


def statement_csv(statement: Statement) -> str:
    """Line items, then the batch lines' share of the total ("of which batch"), then the total row."""
    lines = ([getattr(line, f) for f in _LINE_FIELDS] for line in statement.lines)
    every = statement.lines
    total = ["total", "", "", sum(x.requests for x in every), sum(x.prompt_tokens for x in every),
             sum(x.output_tokens for x in every), statement.total_micros, statement.total, "", "", "", "", "",
             sum(x.cached_tokens for x in every), statement.cache_saved_micros, statement.batch_saved_micros]
    batch = ["of which batch", "", "", sum(x.requests for x in every if x.batch),
             sum(x.prompt_tokens for x in every if x.batch), sum(x.output_tokens for x in every if x.batch),
             statement.batch_micros, micros_to_decimal(statement.batch_micros), "", "", "", "", "true",
             sum(x.cached_tokens for x in every if x.batch), sum(x.cache_saved_micros for x in every if x.batch),
             statement.batch_saved_micros]
    return csv_text([list(_LINE_FIELDS), *lines, batch, total])
