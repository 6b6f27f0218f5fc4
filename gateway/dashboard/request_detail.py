"""One request as the ledger holds it, and the search by request id that support starts from.

`GET /dashboard/request?id=...` finds a request of the team on screen by the id a customer quotes: the
ledger's id, or the response's own (`chatcmpl-<id>`, `cmpl-<id>`, `msg_<id>`, `resp_<id>`); found, it
redirects to `GET /dashboard/requests/<id>`, the detail (times, tokens, prices and cost, status and error,
finish reason, dialect, endpoint route, adapter, cold-start wait, worker, key, user). Only the team's own records are
searched: another team's id answers exactly as an unknown one (404, the same words), so ids do not leak
across teams. The id is bounded and checked; a bad one is said at the search field (400)."""

from __future__ import annotations

import re
from urllib.parse import quote

from litestar import Request, Response, get
from litestar.response import Redirect, Template

from auth.service import AuthService
from auth.sessions import Session, SessionStore
from billing.insights.requests import one, sent_as
from billing.ledger import Ledger
from billing.params import UsageParamError
from billing.records import LedgerEntry
from gateway.authentication.middleware import PUBLIC
from gateway.dashboard.access import BASE, signed_in_scope
from gateway.dashboard.filters import zone_or_utc
from gateway.dashboard.scope import DashboardScope

MAX_ID = 128
# ours and the responses' ids, and a caller's own X-Request-Id (gateway.edge.access_log.CLIENT_ID_PATTERN)
REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:=+/-]{0,127}")
RESPONSE_PREFIX = re.compile(r"(?:chatcmpl-|cmpl-|msg_|resp_)(.+)")  # the ids the dialects answer with
NOT_FOUND = "No request with this id in this team."
# the ledger's finish reasons (billing.records.FinishReason) in a reader's words
FINISH_WORDS = {"stop": "the model ended its answer", "stop_sequence": "a stop sequence or stop token was generated",
                "length": "max_tokens or the model's context was reached", "tool_calls": "the model called a tool",
                "cancelled": "the client cancelled it", "timeout": "it ran out of time", "error": "it failed"}


def read_request_id(raw: str) -> str:
    """The id as typed, bounded: UsageParamError (shown at the field) otherwise."""
    text = raw.strip()
    if not text:
        raise UsageParamError("id", "Enter a request id.")
    if len(text) > MAX_ID or not REQUEST_ID.fullmatch(text):
        raise UsageParamError("id", f"A request id has at most {MAX_ID} letters, digits and . _ : = + / - "
                                    "(as a response's id or X-Request-Id shows it).")
    return text


async def find(ledger: Ledger, team_id: str, request_id: str) -> LedgerEntry | None:
    """The team's record of `request_id`: the ledger's id, a response's id, or the caller's own X-Request-Id (the
    newest request that sent it)."""
    found = await one(ledger.store, team_id, request_id)
    if found is None and (bare := RESPONSE_PREFIX.fullmatch(request_id)):
        found = await one(ledger.store, team_id, bare.group(1))
    if found is None:
        sent = await sent_as(ledger.store, team_id, request_id, limit=1)
        found = sent[0] if sent else None
    return found


def _page(session: Session, scope: DashboardScope, tz: str, *, typed: str = "", problem: str | None = None,
          entry: LedgerEntry | None = None, labels: dict | None = None, status: int = 200) -> Template:
    return Template("request.html.j2", status_code=status, context={
        "session": session, "scope": scope, "page": "request", "tz": tz, "typed": typed, "problem": problem,
        "e": entry.flat() if entry is not None else None, "labels": labels or {}, "finish_words": FINISH_WORDS})


async def _found_or_page(ledger: Ledger, session: Session, scope: DashboardScope, tz: str,
                         typed: str) -> LedgerEntry | Template:
    """The team's record of the id typed, or the page that says why there is none (400 malformed, 404)."""
    try:
        request_id = read_request_id(typed)
    except UsageParamError as exc:
        return _page(session, scope, tz, typed=typed[:MAX_ID + 1], problem=exc.message, status=400)
    found = await find(ledger, scope.team.id, request_id)
    if found is None:
        return _page(session, scope, tz, typed=request_id, problem=NOT_FOUND, status=404)
    return found


def _tz(request: Request) -> str:
    # a refused zone still shows the detail (in UTC): the zone's own error belongs to the pages that take it
    return zone_or_utc(request.query_params)[0]


@get("/request", opt=PUBLIC)
async def search(request: Request, sessions: SessionStore, auth: AuthService, ledger: Ledger) -> Response:
    session, scope = await signed_in_scope(request, sessions, auth)
    tz = _tz(request)
    raw = request.query_params.get("id")
    if raw is None:
        return _page(session, scope, tz)
    found = await _found_or_page(ledger, session, scope, tz, raw)
    if isinstance(found, Template):
        return found
    zone = f"&tz={quote(tz)}" if tz != "UTC" else ""
    return Redirect(f"{BASE}/requests/{quote(found.usage.request_id)}?team_id={quote(scope.team.id)}{zone}",
                    status_code=303)


@get("/requests/{request_id:str}", opt=PUBLIC)
async def detail(request: Request, sessions: SessionStore, auth: AuthService, ledger: Ledger,
                 request_id: str) -> Response:
    session, scope = await signed_in_scope(request, sessions, auth)
    tz = _tz(request)
    found = await _found_or_page(ledger, session, scope, tz, request_id)
    if isinstance(found, Template):
        return found
    usage = found.usage
    labels = await auth.directory.names([usage.key_id], [usage.user_id] if usage.user_id else [])
    return _page(session, scope, tz, typed=usage.request_id, entry=found, labels=labels)


REQUEST_HANDLERS = [search, detail]
