"""The usage API.

- `GET /v1/usage`, `GET /admin/usage` (+ `format=csv`): sums grouped by day, hour, model, key, user,
  dialect, status, LoRA adapter (`-`: the base model) (or team, admin), for a window and filters.
- `GET /v1/usage/overview`, `GET /admin/usage/overview` (optional `team_id`): the dashboard's
  overview (billing/insights/overview.py) as JSON; `granularity` hour, day, week or month, `tz` for
  local time, `series_by` model, key, user, dialect, endpoint or adapter (what the series are split by).
- `GET /admin/usage/teams`: every team's sums over the window, biggest spender first.
- `GET /v1/usage/requests`: the caller's team's latest requests, newest first, a page at a time.
- `GET /admin/usage/records`: raw priced records of any team, oldest first, a page at a time
  (`limit` up to 10,000, default 1,000; `cursor` from the previous page's `next_cursor`), or with
  `format=csv` every record of the window as one streamed CSV body.
- `GET /v1/usage/statement`, `GET /admin/usage/statement`: a monthly statement (JSON or CSV).

Query parameters: `start`, `end` (ISO dates or datetimes, UTC), filters `model`, `key_id`,
`user_id` (`-`: service keys), `dialect`, `status`, `adapter` (each may repeat), `tz` (IANA zone for
day and hour groups). Every bad value answers 400 naming its parameter.

The app that mounts these routers authenticates: `request.user` is the caller (with `team_id`), and the
admin router takes the guard that admits admins only. The ledger is injected under the name `ledger`.
Errors (`UsageParamError`, the store's `StoreUnavailable`) are rendered by the app.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import msgspec
from litestar import Request, Response, Router, get
from litestar.response import Stream
from litestar.types import Guard

from billing.exports.csv import records_csv, report_csv, statement_csv
from billing.insights.overview import SERIES_GROUPS, overview
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

TEAM_GROUPS = ("day", "hour", "model", "key", "user", "dialect", "status", "adapter", "none")
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
    # of those: prompt tokens from the prefix cache, batch lines and their cost, and what the cached-input price and
    # the batch discount saved against the list prices (billing/README.md, "Cached tokens and batch prices")
    cached_tokens: int = 0
    batch_requests: int = 0
    batch_cost_micros: int = 0
    cache_saved_micros: int = 0
    batch_saved_micros: int = 0

    @classmethod
    def of(cls, row: UsageRow) -> RowOut:
        return cls(row.key, row.requests, row.prompt_tokens, row.completion_tokens, row.compute_tokens,
                   row.cost_micros, micros_to_decimal(row.cost_micros), row.cached_tokens, row.batch_requests,
                   row.batch_cost_micros, row.cache_saved_micros, row.batch_saved_micros)


class UsageOut(msgspec.Struct):
    object: str
    team_id: str | None
    start: datetime
    end: datetime
    group_by: str
    rows: list[RowOut]
    totals: RowOut


async def _usage(ledger: Ledger, request: Request, team_id: str | None, groups: tuple[str, ...],
                 formats: tuple[str, ...]) -> Response:
    q = request.query_params
    start, end = parse_window(q)
    group_by = parse_choice(q, "group_by", groups, "day")
    fmt = parse_choice(q, "format", formats, "json")
    report = await ledger.usage(UsageQuery(start.timestamp(), end.timestamp(), team_id, group_by,
                                           parse_filters(q), parse_tz(q)))
    if fmt == "csv":
        return Response(report_csv(report, group_by), media_type="text/csv",
                        headers={"content-disposition": 'attachment; filename="usage.csv"'})
    return Response(UsageOut("usage", team_id, start, end, group_by, [RowOut.of(r) for r in report.rows],
                             RowOut.of(report.totals)))


async def _records(ledger: Ledger, request: Request, team_id: str | None, *, newest_first: bool,
                   default_limit: int) -> Response:
    """One page of records as JSON, or with format=csv every record of the selection, streamed."""
    q = request.query_params
    selection = parse_selection(q, team_id)
    fmt = parse_choice(q, "format", ("json", "csv"), "json")
    limit = parse_limit(q, default_limit)
    cursor = parse_cursor(q, newest_first=newest_first)
    if fmt == "csv":
        return Stream(records_csv(ledger.store, selection, newest_first=newest_first), media_type="text/csv",
                      headers={"content-disposition": 'attachment; filename="usage-records.csv"'})
    result = await page(ledger.store, selection, limit, cursor, newest_first=newest_first)
    return Response({"object": "list", "data": [e.flat() for e in result.entries],
                     "has_more": result.next_cursor is not None, "next_cursor": result.next_cursor})


async def _overview(ledger: Ledger, request: Request, team_id: str | None) -> Response:
    q = request.query_params
    selection = parse_selection(q, team_id)
    tz = parse_tz(q)
    series_by = parse_choice(q, "series_by", tuple(SERIES_GROUPS), "model")
    return Response(await overview(ledger.store, selection, parse_granularity(q, selection, tz), tz, series_by))


async def _statement(ledger: Ledger, request: Request, team_id: str) -> Response:
    q = request.query_params
    fmt = parse_choice(q, "format", ("json", "csv"), "json")
    month = q.get("month") or ""
    try:
        statement = await monthly_statement(ledger.store, team_id, month)
    except ValueError as exc:
        raise UsageParamError("month", str(exc)) from exc
    if fmt == "csv":
        return Response(statement_csv(statement), media_type="text/csv",
                        headers={"content-disposition": f'attachment; filename="statement-{month}.csv"'})
    return Response(statement)


@get("/v1/usage")
async def team_usage(request: Request, ledger: Ledger) -> Response:
    return await _usage(ledger, request, request.user.team_id, TEAM_GROUPS, ("json",))


@get("/v1/usage/overview")
async def team_overview(request: Request, ledger: Ledger) -> Response:
    return await _overview(ledger, request, request.user.team_id)


@get("/v1/usage/requests")
async def team_requests(request: Request, ledger: Ledger) -> Response:
    return await _records(ledger, request, request.user.team_id, newest_first=True, default_limit=REQUESTS_PAGE)


@get("/v1/usage/statement")
async def team_statement(request: Request, ledger: Ledger) -> Response:
    return await _statement(ledger, request, request.user.team_id)


@get("/admin/usage")
async def admin_usage(request: Request, ledger: Ledger) -> Response:
    return await _usage(ledger, request, parse_team(request.query_params), (*TEAM_GROUPS, "team"), ("json", "csv"))


@get("/admin/usage/overview")
async def admin_overview(request: Request, ledger: Ledger) -> Response:
    return await _overview(ledger, request, parse_team(request.query_params))


@get("/admin/usage/teams")
async def admin_teams(request: Request, ledger: Ledger) -> Response:
    teams = await team_ranking(ledger.store, parse_selection(request.query_params, None))
    return Response({"object": "list", "data": [{**msgspec.structs.asdict(t), "error_rate": t.error_rate,
                                                 "cost": micros_to_decimal(t.cost_micros)} for t in teams]})


@get("/admin/usage/records")
async def admin_records(request: Request, ledger: Ledger) -> Response:
    return await _records(ledger, request, parse_team(request.query_params), newest_first=False,
                          default_limit=RECORDS_PAGE)


@get("/admin/usage/statement")
async def admin_statement(request: Request, ledger: Ledger) -> Response:
    team_id = parse_team(request.query_params)
    if team_id is None:
        raise UsageParamError("team_id", "team_id is required", "missing_parameter")
    return await _statement(ledger, request, team_id)


def usage_router() -> Router:
    return Router(path="/", route_handlers=[team_usage, team_overview, team_requests, team_statement])


def admin_usage_router(guards: Sequence[Guard]) -> Router:
    return Router(path="/", route_handlers=[admin_usage, admin_overview, admin_teams, admin_records, admin_statement],
                  guards=list(guards))
