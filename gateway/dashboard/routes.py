"""The dashboard's pages under /dashboard: sign in and out, the overview of a team, the admin's ranking.

The pages authenticate by the dashboard session (auth/sessions.py), not by a bearer key, so
they opt out of the API-key middleware (`opt=PUBLIC`). Every page reads through the auth and billing
services only. Errors are pages: a `SluiceError` renders error.html with its status; a bad key at sign-in
is a message on the sign-in page.
"""

from __future__ import annotations

import asyncio
import time
from urllib.parse import urlencode

from litestar import Request, Response, Router, get, post
from litestar.datastructures import CacheControlHeader
from litestar.di import Provide
from litestar.response import Redirect, Stream, Template
from litestar.static_files import create_static_files_router

from auth.errors import AuthError
from auth.policy import sees_every_team
from auth.service import AuthService
from auth.sessions import Session, SessionStore
from billing.exports.csv import records_csv, statement_csv
from billing.filters import NO_USER
from billing.insights.month import month_to_date
from billing.insights.overview import overview
from billing.insights.ranking import team_ranking
from billing.insights.requests import page
from billing.ledger import Ledger
from billing.params import UsageParamError, parse_cursor
from billing.statements import monthly_statement
from common.errors import SluiceError
from gateway.authentication.headers import client_address
from gateway.authentication.middleware import PUBLIC, auth_service
from gateway.dashboard.access import (
    BASE,
    Forbidden,
    NotSignedIn,
    cookie,
    current_session,
    posted_form,
    read_so_far,
    signed_in_scope,
)
from gateway.dashboard.account_pages import ACCOUNT_HANDLERS
from gateway.dashboard.budget_panel import budget_rows
from gateway.dashboard.compression import gzipped
from gateway.dashboard.filters import RANGES, View, filter_choices, read_view, read_view_or_problem
from gateway.dashboard.headers import page_headers
from gateway.dashboard.key_edit import EDIT_HANDLERS
from gateway.dashboard.keys import KEY_HANDLERS
from gateway.dashboard.limits import LIMITS_HANDLERS, team_limits
from gateway.dashboard.members import MEMBER_HANDLERS
from gateway.dashboard.oidc import OIDC_HANDLERS
from gateway.dashboard.render import STATIC
from gateway.dashboard.request_detail import REQUEST_HANDLERS
from gateway.dashboard.scope import DashboardScope
from gateway.dashboard.sign_in_page import login_page, next_page_of
from gateway.dashboard.team_budgets import BUDGET_HANDLERS
from gateway.dashboard.team_pages import TEAM_HANDLERS
from gateway.serving.services import Services

MAX_KEY_CHARS = 512
REQUESTS_PAGE = 50
MAX_LABELS = 200  # named rows per breakdown; the rest show their ids
CHART_POINTS = 1_000  # hourly buckets a chart gets at most: fewer than its pixel columns (~1,300 at 1440 px)


@get("/", opt=PUBLIC)
async def home() -> Redirect:
    return Redirect(f"{BASE}/overview")


@get("/login", opt=PUBLIC)
async def login_form(request: Request, sessions: SessionStore) -> Template:
    session = await current_session(request, sessions) or sessions.anonymous()
    return login_page(request, session, next_page=next_page_of(request.query_params.get("next")))


@post("/login", opt=PUBLIC, status_code=303)
async def login(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session = await current_session(request, sessions)
    form = await posted_form(request, session)
    next_page = next_page_of(form.get("next"))
    key = form.get("api_key")
    key = key.strip() if isinstance(key, str) else ""
    if not key:
        return login_page(request, session, "Enter an API key.", 400, next_page)
    if len(key) > MAX_KEY_CHARS:
        return login_page(request, session, f"An API key has at most {MAX_KEY_CHARS} characters.", 400, next_page)
    try:
        principal = await auth.authenticate(f"Bearer {key}", None, client_address(request, auth.clients))
    except AuthError as exc:
        return login_page(request, session, exc.message, exc.status, next_page)
    if session.signed_in:
        await sessions.end(session.id)
    # a new id once signed in: a planted cookie never becomes a signed-in one
    signed = await sessions.start(key_id=principal.key_id, is_admin=principal.is_admin)
    # the operator lands on the ranking of every team, not on the (often empty) default team's overview
    landing = next_page or f"{BASE}/{'teams' if sees_every_team(principal.is_admin) else 'overview'}"
    return Redirect(landing, status_code=303, cookies=[cookie(request, signed)])


@post("/logout", opt=PUBLIC, status_code=303)
async def logout(request: Request, sessions: SessionStore) -> Response:
    session = await current_session(request, sessions)
    await posted_form(request, session)
    await sessions.end(session.id)
    return Redirect(f"{BASE}/login", status_code=303, cookies=[cookie(request, None)])


async def _labels(auth: AuthService, key_ids: list[str], user_ids: list[str]) -> dict[str, str]:
    """Names for the ids of the breakdowns (the ledger keeps ids; revoked keys keep their names)."""
    return await auth.directory.names(key_ids[:MAX_LABELS], user_ids[:MAX_LABELS])


async def _page(name: str, session: Session, scope: DashboardScope, view: View, auth: AuthService, ledger: Ledger,
                **context) -> Template:
    """A page of a team's view: the bar (team switcher, sign-out form) and the filter form (with the models,
    keys and dialects the window saw to choose from) need these."""
    choices = await filter_choices(ledger, view)
    key_names = {**await _labels(auth, choices.key_ids, choices.user_ids), NO_USER: "service keys (no user)"}
    return Template(f"{name}.html.j2", context={"page": name, "session": session, "scope": scope, "view": view,
                                                "ranges": RANGES, "choices": choices, "key_names": key_names,
                                                **context})


async def _refused(name: str, session: Session, scope: DashboardScope, view: View, auth: AuthService,
                   ledger: Ledger) -> Template:
    """The page with its filter form only, the refused parameter named at its field (400)."""
    template = await _page(name, session, scope, view, auth, ledger)
    template.status_code = view.problem.status
    return template


@get("/overview", opt=PUBLIC)
async def overview_page(request: Request, sessions: SessionStore, auth: AuthService, ledger: Ledger,
                        services: Services) -> Response:
    session, scope = await signed_in_scope(request, sessions, auth)
    view = read_view_or_problem(request.query_params, scope.team.id)
    if view.problem is not None:
        return await _refused("overview", session, scope, view, auth, ledger)
    result, month = await asyncio.gather(
        overview(ledger.store, view.selection, view.granularity, view.tz, view.group_by, max_points=CHART_POINTS),
        month_to_date(ledger.store, scope.team.id, time.time()))
    # the team's month tokens, counted once: the month tile's and the token budget row's
    limits, names = await team_limits(scope, auth, services, team_month_tokens=month.budget_tokens_used)
    budgets = budget_rows(limits, names, month.month, month.projected_tokens)
    labels = await _labels(auth, [r.key for r in result.by_key], [r.key for r in result.by_user])
    # htmx swaps the page's <main> in place
    return await _page("overview", session, scope, view, auth, ledger, o=result, month=month, labels=labels,
                       budgets=budgets, served=set(services.endpoints.controllers))


@get("/teams", opt=PUBLIC)
async def teams_page(request: Request, sessions: SessionStore, auth: AuthService, ledger: Ledger) -> Response:
    session, scope = await signed_in_scope(request, sessions, auth)
    if not sees_every_team(scope.is_admin):
        raise Forbidden("The ranking across teams needs the admin key.")
    view = read_view_or_problem(request.query_params, None)
    if view.problem is not None:
        return await _refused("teams", session, scope, view, auth, ledger)
    names = {t.id: t.name for t in scope.teams}
    ranking = await team_ranking(ledger.store, view.selection)
    return await _page("teams", session, scope, view, auth, ledger, ranking=ranking, names=names)


@get("/requests", opt=PUBLIC)
async def requests_page(request: Request, sessions: SessionStore, auth: AuthService, ledger: Ledger) -> Response:
    """The latest requests of the view, newest first, a page at a time (metadata only: the ledger holds no text)."""
    session, scope = await signed_in_scope(request, sessions, auth)
    view = read_view_or_problem(request.query_params, scope.team.id)
    if view.problem is not None:
        return await _refused("requests", session, scope, view, auth, ledger)
    result = await page(ledger.store, view.selection, REQUESTS_PAGE,
                        parse_cursor(request.query_params, newest_first=True), newest_first=True)
    entries = [e.flat() for e in result.entries]
    labels = await _labels(auth, list(dict.fromkeys(e["key_id"] for e in entries)),
                           list(dict.fromkeys(e["user_id"] for e in entries if e["user_id"])))
    return await _page("requests", session, scope, view, auth, ledger, entries=entries, labels=labels,
                       next_cursor=result.next_cursor)


@get("/export.csv", opt=PUBLIC)
async def export_csv(request: Request, sessions: SessionStore, auth: AuthService, ledger: Ledger) -> Response:
    """Every record of exactly the view on screen (team, range, filters), as the usage API's CSV."""
    _, scope = await signed_in_scope(request, sessions, auth)
    view = read_view(request.query_params, scope.team.id)
    return Stream(records_csv(ledger.store, view.selection, newest_first=True), media_type="text/csv",
                  headers={"content-disposition": f'attachment; filename="usage-{scope.team.id}.csv"'})


@get("/statement.csv", opt=PUBLIC)
async def statement_download(request: Request, sessions: SessionStore, auth: AuthService, ledger: Ledger) -> Response:
    """The team's monthly statement (line items per model and price), as the usage API's CSV."""
    _, scope = await signed_in_scope(request, sessions, auth)
    month = request.query_params.get("month") or ""
    try:
        statement = await monthly_statement(ledger.store, scope.team.id, month)
    except ValueError as exc:
        raise UsageParamError("month", str(exc)) from exc
    return Response(statement_csv(statement), media_type="text/csv",
                    headers={"content-disposition": f'attachment; filename="statement-{scope.team.id}-{month}.csv"'})


def _sign_in_first(request: Request, _: NotSignedIn) -> Redirect:
    """The sign-in page, which comes back here once signed in (a GET page only: a form is not posted again)."""
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    back = next_page_of(here) if request.method == "GET" else None
    return Redirect(f"{BASE}/login" + (f"?{urlencode({'next': back})}" if back else ""))


def _error_page(request: Request, exc: SluiceError) -> Template:
    """The error with a way on: the dashboard's home and, signed in, the sign-out form (a key locked out of the
    team it asked for still signs out)."""
    session, scope = read_so_far(request)
    signed = session is not None and session.signed_in
    return Template("error.html.j2", status_code=exc.status, context={
        "status": exc.status, "message": exc.message, "session": session if signed else None,
        "scope": scope if signed else None, "page": ""})


YEAR_S = 365 * 86400


def static_router() -> Router:
    """The dashboard's CSS and the vendored browser libraries (no CDN: it works without internet), gzipped and
    cached for a year: the pages link them with their digest (`render.static_url`), so a new file is a new URL."""
    return create_static_files_router(path=f"{BASE}/static", directories=[STATIC], opt=PUBLIC, name="dashboard-static",
                                      cache_control=CacheControlHeader(public=True, max_age=YEAR_S, immutable=True),
                                      middleware=[gzipped])


def _sessions(auth: AuthService) -> SessionStore:
    return SessionStore(auth)  # the sessions live in the auth store, shared by every gateway on it


def dashboard_router() -> Router:
    return Router(path=BASE, route_handlers=[home, login_form, login, logout, overview_page, requests_page, export_csv,
                                                  statement_download,
                                                  teams_page, *KEY_HANDLERS, *EDIT_HANDLERS, *REQUEST_HANDLERS,
                                                  *TEAM_HANDLERS, *LIMITS_HANDLERS, *ACCOUNT_HANDLERS,
                                                  *MEMBER_HANDLERS, *OIDC_HANDLERS, *BUDGET_HANDLERS],
                  dependencies={"sessions": Provide(_sessions, sync_to_thread=False),
                                "auth": Provide(auth_service, sync_to_thread=False)},
                  exception_handlers={SluiceError: _error_page, NotSignedIn: _sign_in_first},
                  # CSP, no framing, no-store: on every answer, error pages included; gzipped where accepted
                  middleware=[page_headers, gzipped])
