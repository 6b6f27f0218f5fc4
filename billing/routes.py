"""The usage API.

- `GET /v1/usage`, `GET /admin/usage` (+ `format=csv`): sums grouped by day, hour, model, key, user,
  dialect, status (or team, admin), for a window and filters.
- `GET /v1/usage/overview`, `GET /admin/usage/overview` (optional `team_id`): the dashboard's
  overview (billing/insights/overview.py) as JSON; `granularity` hour or day, `tz` for local time.
- `GET /admin/usage/teams`: every team's sums over the window, biggest spender first.
- `GET /v1/usage/requests`: the caller's team's latest requests, newest first, a page at a time.
- `GET /admin/usage/records`: raw priced records of any team, oldest first, a page at a time
  (`limit` up to 10,000, default 1,000; `cursor` from the previous page's `next_cursor`), or with
  `format=csv` every record of the window as one streamed CSV body.
- `GET /v1/usage/statement`, `GET /admin/usage/statement`: a monthly statement (JSON or CSV).

Query parameters: `start`, `end` (ISO dates or datetimes, UTC), filters `model`, `key_id`,
`user_id` (`-`: service keys), `dialect`, `status`, `adapter` (each may repeat), `tz` (IANA zone for
day and hour groups). Every bad value answers 400 naming its parameter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime

import msgspec
from litestar import Request, Response, Router, get
from litestar.exceptions import HTTPException
from litestar.response import Stream

from billing.exports.csv import records_csv, report_csv, statement_csv
from billing.insights.overview import overview
from billing.insights.ranking import team_ranking
from billing.insights.requests import page
from billing.ledger import Ledger
from billing.params import (
    UsageParamError,
    parse_choice,
    parse_cursor,
    parse_filters,
    parse_granularity,
    parse_limit,
    parse_selection,
    parse_team,
    parse_tz,
    parse_window,
)
from billing.statements import monthly_statement
from billing.usage import UsageQuery, UsageRow, micros_to_decimal

Authenticate = Callable[[Request], Awaitable[object]]
TEAM_GROUPS = ("day", "hour", "model", "key", "user", "dialect", "status", "none")
RECORDS_PAGE = 1000
REQUESTS_PAGE = 100


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


def _invalid(exc: UsageParamError) -> Response:
    return error(400, exc.message, "invalid_request_error", exc.param, exc.code)


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


async def _usage(ledger: Ledger, request: Request, team_id: str | None, groups: tuple[str, ...],
                 formats: tuple[str, ...]) -> Response:
    q = request.query_params
    try:
        start, end = parse_window(q)
        group_by = parse_choice(q, "group_by", groups, "day")
        fmt = parse_choice(q, "format", formats, "json")
        query = UsageQuery(start.timestamp(), end.timestamp(), team_id, group_by, parse_filters(q), parse_tz(q))
    except UsageParamError as exc:
        return _invalid(exc)
    report = await ledger.usage(query)
    if fmt == "csv":
        return Response(report_csv(report, group_by), media_type="text/csv",
                        headers={"content-disposition": 'attachment; filename="usage.csv"'})
    return Response(UsageOut("usage", team_id, start, end, group_by, [RowOut.of(r) for r in report.rows],
                             RowOut.of(report.totals)))


async def _records(ledger: Ledger, request: Request, team_id: str | None, *, newest_first: bool,
                   default_limit: int) -> Response:
    """One page of records as JSON, or with format=csv every record of the selection, streamed."""
    q = request.query_params
    try:
        selection = parse_selection(q, team_id)
        fmt = parse_choice(q, "format", ("json", "csv"), "json")
        limit = parse_limit(q, default_limit)
        cursor = parse_cursor(q, newest_first=newest_first)
    except UsageParamError as exc:
        return _invalid(exc)
    if fmt == "csv":
        return Stream(records_csv(ledger.store, selection, newest_first=newest_first), media_type="text/csv",
                      headers={"content-disposition": 'attachment; filename="usage-records.csv"'})
    result = await page(ledger.store, selection, limit, cursor, newest_first=newest_first)
    return Response({"object": "list", "data": [e.flat() for e in result.entries],
                     "has_more": result.next_cursor is not None, "next_cursor": result.next_cursor})


async def _overview(ledger: Ledger, request: Request, team_id: str | None) -> Response:
    q = request.query_params
    try:
        selection = parse_selection(q, team_id)
        tz = parse_tz(q)
        granularity = parse_granularity(q, selection, tz)
    except UsageParamError as exc:
        return _invalid(exc)
    return Response(await overview(ledger.store, selection, granularity, tz))


async def _ranking(ledger: Ledger, request: Request) -> Response:
    try:
        selection = parse_selection(request.query_params, None)
    except UsageParamError as exc:
        return _invalid(exc)
    teams = await team_ranking(ledger.store, selection)
    return Response({"object": "list", "data": [{**msgspec.structs.asdict(t), "error_rate": t.error_rate,
                                                 "cost": micros_to_decimal(t.cost_micros)} for t in teams]})


async def _statement(ledger: Ledger, request: Request, team_id: str) -> Response:
    q = request.query_params
    try:
        fmt = parse_choice(q, "format", ("json", "csv"), "json")
        month = q.get("month") or ""
        statement = await monthly_statement(ledger.store, team_id, month)
    except UsageParamError as exc:
        return _invalid(exc)
    except ValueError as exc:
        return error(400, str(exc), "invalid_request_error", "month", "invalid_parameter")
    if fmt == "csv":
        return Response(statement_csv(statement), media_type="text/csv",
                        headers={"content-disposition": f'attachment; filename="statement-{month}.csv"'})
    return Response(statement)


Answer = Callable[[Request, str | None], Awaitable[Response]]


async def _as_team(authenticate: Authenticate, request: Request, answer: Answer) -> Response:
    """`answer` for the caller's own team."""
    principal = await _principal(authenticate, request)
    if isinstance(principal, Response):
        return principal
    return await answer(request, principal.team_id)


async def _as_admin(authenticate: Authenticate, request: Request, message: str, answer: Answer) -> Response:
    """`answer` for the `team_id` an admin asks about (None: every team); 403 for anyone else."""
    principal = await _principal(authenticate, request)
    if isinstance(principal, Response):
        return principal
    if not getattr(principal, "is_admin", False):
        return error(403, message, "permission_error")
    try:
        team_id = parse_team(request.query_params)
    except UsageParamError as exc:
        return _invalid(exc)
    return await answer(request, team_id)


def usage_router(ledger: Ledger, authenticate: Authenticate) -> Router:
    @get("/v1/usage")
    async def team_usage(request: Request) -> Response:
        return await _as_team(authenticate, request,
                              lambda r, team: _usage(ledger, r, team, TEAM_GROUPS, ("json",)))

    @get("/v1/usage/overview")
    async def team_overview(request: Request) -> Response:
        return await _as_team(authenticate, request, lambda r, team: _overview(ledger, r, team))

    @get("/v1/usage/requests")
    async def team_requests(request: Request) -> Response:
        return await _as_team(authenticate, request, lambda r, team: _records(
            ledger, r, team, newest_first=True, default_limit=REQUESTS_PAGE))

    @get("/v1/usage/statement")
    async def team_statement(request: Request) -> Response:
        return await _as_team(authenticate, request, lambda r, team: _statement(ledger, r, team))

    return Router(path="/", route_handlers=[team_usage, team_overview, team_requests, team_statement])


def admin_usage_router(ledger: Ledger, authenticate: Authenticate) -> Router:
    @get("/admin/usage")
    async def admin_usage(request: Request) -> Response:
        return await _as_admin(authenticate, request, "admin usage needs an admin key", lambda r, team: _usage(
            ledger, r, team, (*TEAM_GROUPS, "team"), ("json", "csv")))

    @get("/admin/usage/overview")
    async def admin_overview(request: Request) -> Response:
        return await _as_admin(authenticate, request, "admin usage needs an admin key",
                               lambda r, team: _overview(ledger, r, team))

    @get("/admin/usage/teams")
    async def admin_teams(request: Request) -> Response:
        return await _as_admin(authenticate, request, "admin usage needs an admin key",
                               lambda r, _team: _ranking(ledger, r))

    @get("/admin/usage/records")
    async def admin_records(request: Request) -> Response:
        return await _as_admin(authenticate, request, "usage records need an admin key", lambda r, team: _records(
            ledger, r, team, newest_first=False, default_limit=RECORDS_PAGE))

    @get("/admin/usage/statement")
    async def admin_statement(request: Request) -> Response:
        async def answer(r: Request, team: str | None) -> Response:
            if team is None:
                return error(400, "team_id is required", "invalid_request_error", "team_id", "missing_parameter")
            return await _statement(ledger, r, team)

        return await _as_admin(authenticate, request, "statements of other teams need an admin key", answer)

    return Router(path="/", route_handlers=[admin_usage, admin_overview, admin_teams, admin_records, admin_statement])
