"""The usage API: `GET /v1/usage` for the caller's team, `GET /admin/usage` across teams (+ CSV),
`GET /admin/usage/records` the raw priced records (audits, reconciliation).

The app that mounts these routers authenticates: `request.user` is the caller (with `team_id`), and the
admin router takes the guard that admits admins only. The ledger is injected under the name `ledger`.
Errors (`UsageParamError`, the store's `StoreUnavailable`) are rendered by the app.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from datetime import datetime

import msgspec
from litestar import Request, Response, Router, get
from litestar.types import Guard

from billing.ledger import Ledger
from billing.params import parse_choice, parse_window
from billing.records import LedgerEntry
from billing.usage import UsageQuery, UsageReport, UsageRow, micros_to_decimal


class RowOut(msgspec.Struct):
    key: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    compute_tokens: int
    cost_micros: int
    cost: str  # the same amount as a decimal string, for humans

    @classmethod
    def of(cls, row: UsageRow) -> RowOut:
        return cls(row.key, row.requests, row.prompt_tokens, row.completion_tokens, row.compute_tokens,
                   row.cost_micros, micros_to_decimal(row.cost_micros))


class UsageOut(msgspec.Struct):
    object: str
    team_id: str | None
    start: datetime
    end: datetime
    group_by: str
    rows: list[RowOut]
    totals: RowOut


async def _answer(ledger: Ledger, request: Request, team_id: str | None, groups: tuple[str, ...],
                  formats: tuple[str, ...]) -> Response:
    start, end = parse_window(request.query_params)
    group_by = parse_choice(request.query_params, "group_by", groups, "day")
    fmt = parse_choice(request.query_params, "format", formats, "json")
    report = await ledger.usage(UsageQuery(start.timestamp(), end.timestamp(), team_id, group_by))
    if fmt == "csv":
        return _csv(report, group_by)
    body = UsageOut("usage", team_id, start, end, group_by, [RowOut.of(r) for r in report.rows],
                    RowOut.of(report.totals))
    return Response(body)


def _csv(report: UsageReport, group_by: str) -> Response:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([group_by, "requests", "prompt_tokens", "completion_tokens", "compute_tokens",
                     "cost_micros", "cost"])
    for r in report.rows:
        writer.writerow([r.key, r.requests, r.prompt_tokens, r.completion_tokens, r.compute_tokens,
                         r.cost_micros, micros_to_decimal(r.cost_micros)])
    return Response(out.getvalue(), media_type="text/csv",
                    headers={"content-disposition": 'attachment; filename="usage.csv"'})


@get("/v1/usage")
async def team_usage(request: Request, ledger: Ledger) -> Response:
    return await _answer(ledger, request, request.user.team_id, ("day", "model", "key", "none"), ("json",))


@get("/admin/usage")
async def admin_usage(request: Request, ledger: Ledger) -> Response:
    team_id = request.query_params.get("team_id") or None
    return await _answer(ledger, request, team_id, ("day", "model", "key", "team", "none"), ("json", "csv"))


@get("/admin/usage/records")
async def admin_records(request: Request, ledger: Ledger) -> Response:
    start, end = parse_window(request.query_params)
    team_id = request.query_params.get("team_id") or None
    entries = await ledger.records(UsageQuery(start.timestamp(), end.timestamp(), team_id, "none"))
    return Response({"object": "list", "data": [_record(e) for e in entries]})


def usage_router() -> Router:
    return Router(path="/", route_handlers=[team_usage])


def admin_usage_router(guards: Sequence[Guard]) -> Router:
    return Router(path="/", route_handlers=[admin_usage, admin_records], guards=list(guards))


def _record(entry: LedgerEntry) -> dict:
    """Named fields (the stored structs are array-like)."""
    return {**msgspec.structs.asdict(entry.usage), "input_price_micros": entry.input_price_micros,
            "output_price_micros": entry.output_price_micros, "cost_micros": entry.cost_micros,
            "recorded_at": entry.recorded_at}
