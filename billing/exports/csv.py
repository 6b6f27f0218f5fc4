"""CSV renderings of the usage views: each has the JSON's rows and values, in the same order, plus a
decimal `cost` column for people. Record listings stream page by page, so an export of any window
holds one page in memory."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime

import msgspec

from billing.filters import Selection
from billing.insights.requests import every_page
from billing.insights.sums import Sums
from billing.records import LedgerEntry, UsageRecord
from billing.statements import Statement
from billing.store.base import UsageStore
from billing.usage import UsageReport, micros_to_decimal

_ROW_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "compute_tokens", "cost_micros")
_OUTCOMES = ("ok", "cancelled", "errors", "rejected", "rate_limited")
RECORD_FIELDS: tuple[str, ...] = (*UsageRecord.__struct_fields__, "input_price_micros", "output_price_micros",
                                  "cost_micros", "recorded_at")
_LINE_FIELDS = ("model", "input_price_micros", "output_price_micros", "requests", "prompt_tokens", "output_tokens",
                "cost_micros", "cost", "first_day", "last_day")


def csv_text(rows: Iterable[Iterable]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def report_csv(report: UsageReport, group_by: str) -> str:
    """The usage API's rows (`GET /admin/usage?format=csv`)."""
    return csv_text([[group_by, *_ROW_FIELDS, "cost"],
                     *([r.key, *(getattr(r, f) for f in _ROW_FIELDS), micros_to_decimal(r.cost_micros)]
                       for r in report.rows)])


def sums_csv(rows: Iterable[Sums], key_name: str) -> str:
    """A breakdown or ranking table of the overview (one row per model, key, user or team)."""
    fields = (*_ROW_FIELDS, *_OUTCOMES)
    return csv_text([[key_name, *fields, "cost"],
                     *([r.key, *(getattr(r, f) for f in fields), micros_to_decimal(r.cost_micros)] for r in rows)])


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).isoformat()


def _record_row(entry: LedgerEntry) -> list:
    # RECORD_FIELDS' order: `LedgerEntry.flat()` without building the dict
    return [*msgspec.structs.astuple(entry.usage), entry.input_price_micros, entry.output_price_micros,
            entry.cost_micros, entry.recorded_at, _iso(entry.usage.time), micros_to_decimal(entry.cost_micros)]


async def records_csv(store: UsageStore, selection: Selection, *, newest_first: bool = False,
                      page_size: int = 2000) -> AsyncIterator[str]:
    """Every record of the view as CSV text, one chunk per page (a streamed response body)."""
    yield csv_text([[*RECORD_FIELDS, "time_utc", "cost"]])
    async for entries in every_page(store, selection, page_size, newest_first=newest_first):
        yield csv_text(_record_row(e) for e in entries)


def statement_csv(statement: Statement) -> str:
    """Line items, then a total row."""
    lines = ([getattr(line, f) for f in _LINE_FIELDS] for line in statement.lines)
    total = ["total", "", "", sum(x.requests for x in statement.lines), sum(x.prompt_tokens for x in statement.lines),
             sum(x.output_tokens for x in statement.lines), statement.total_micros, statement.total, "", ""]
    return csv_text([list(_LINE_FIELDS), *lines, total])
