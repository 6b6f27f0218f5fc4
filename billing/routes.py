"""The usage API: `GET /v1/usage` for the caller's team, `GET /admin/usage` across teams (+ CSV),
`GET /admin/usage/records` the raw priced records (audits, reconciliation)."""

from __future__ import annotations

import csv
import io
from collections.abc import Awaitable, Callable
from datetime import datetime

import msgspec
from litestar import Request, Response, Router, get
from litestar.exceptions import HTTPException

from billing.ledger import Ledger
from billing.params import UsageParamError, parse_choice, parse_window
from billing.records import LedgerEntry
from billing.usage import UsageQuery, UsageReport, UsageRow, micros_to_decimal

Authenticate = Callable[[Request], Awaitable[object]]


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


def error(status: int, message: str, type_: str, param: str | None = None, code: str | None = None) -> Response:
    return Response({"error": {"message": message, "type": type_, "param": param, "code": code}}, status_code=status)


async def _principal(authenticate: Authenticate, request: Request) -> object | Response:
    """The caller, or the error response; auth failures keep their status in our envelope."""
    try:
        principal = await authenticate(request)
    except HTTPException as exc:
        return error(exc.status_code, str(exc.detail), "authentication_error" if exc.status_code == 401
                     else "permission_error")
    except Exception as exc:
        status = getattr(exc, "status_code", None)
        if not isinstance(status, int):
            raise
        return error(status, str(exc), "authentication_error" if status == 401 else "permission_error")
    if principal is None:
        return error(401, "missing or invalid API key", "authentication_error")
    return principal


async def _answer(ledger: Ledger, request: Request, team_id: str | None, groups: tuple[str, ...],
                  formats: tuple[str, ...]) -> Response:
    try:
        start, end = parse_window(request.query_params)
        group_by = parse_choice(request.query_params, "group_by", groups, "day")
        fmt = parse_choice(request.query_params, "format", formats, "json")
    except UsageParamError as exc:
        return error(400, exc.message, "invalid_request_error", exc.param, exc.code)
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


def usage_router(ledger: Ledger, authenticate: Authenticate) -> Router:
    @get("/v1/usage")
    async def team_usage(request: Request) -> Response:
        principal = await _principal(authenticate, request)
        if isinstance(principal, Response):
            return principal
        return await _answer(ledger, request, principal.team_id, ("day", "model", "key", "none"), ("json",))

    return Router(path="/", route_handlers=[team_usage])


async def _refuse_non_admin(authenticate: Authenticate, request: Request, message: str) -> Response | None:
    """The error response for a caller who is not an authenticated admin, or None to go on."""
    principal = await _principal(authenticate, request)
    if isinstance(principal, Response):
        return principal
    if not getattr(principal, "is_admin", False):
        return error(403, message, "permission_error")
    return None


def admin_usage_router(ledger: Ledger, authenticate: Authenticate) -> Router:
    @get("/admin/usage")
    async def admin_usage(request: Request) -> Response:
        refused = await _refuse_non_admin(authenticate, request, "admin usage needs an admin key")
        if refused is not None:
            return refused
        team_id = request.query_params.get("team_id") or None
        return await _answer(ledger, request, team_id, ("day", "model", "key", "team", "none"), ("json", "csv"))

    @get("/admin/usage/records")
    async def admin_records(request: Request) -> Response:
        refused = await _refuse_non_admin(authenticate, request, "usage records need an admin key")
        if refused is not None:
            return refused
        try:
            start, end = parse_window(request.query_params)
        except UsageParamError as exc:
            return error(400, exc.message, "invalid_request_error", exc.param, exc.code)
        team_id = request.query_params.get("team_id") or None
        entries = await ledger.records(UsageQuery(start.timestamp(), end.timestamp(), team_id, "none"))
        return Response({"object": "list", "data": [_record(e) for e in entries]})

    return Router(path="/", route_handlers=[admin_usage, admin_records])


def _record(entry: LedgerEntry) -> dict:
    """Named fields (the stored structs are array-like)."""
    return {**msgspec.structs.asdict(entry.usage), "input_price_micros": entry.input_price_micros,
            "output_price_micros": entry.output_price_micros, "cost_micros": entry.cost_micros,
            "recorded_at": entry.recorded_at}
