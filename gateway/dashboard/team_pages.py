"""The owners' read-only audit log of their team (the entries that name the team: its keys created, rotated,
edited, revoked or blocked, its members invited, joined, promoted or removed, its limits changed); the Members
page is gateway/dashboard/members.py. The rule is the
keys page's (auth/policy.py `check_manages`): owners and the admin; a member or a service key gets 403 and
no link in the bar. The audit log is paged newest first (`cursor`, as the admin API's); a cursor this page
did not hand out is said at the paging link (400), never a bare error."""

from __future__ import annotations

from litestar import Request, Response, get
from litestar.response import Template

from auth.clock import parse_iso
from auth.errors import RequestError
from auth.keys import display_prefix
from auth.paging import parse_cursor
from auth.service import AuthService
from auth.sessions import SessionStore
from gateway.authentication.middleware import PUBLIC
from gateway.dashboard.filters import zone_or_utc
from gateway.dashboard.key_limits import said
from gateway.dashboard.keys import _owner_scope
from gateway.dashboard.render import when

AUDIT_PAGE = 50


def _local(iso: str, tz: str) -> str:
    """An API time (ISO 8601, UTC) as every dashboard table writes it, in the view's zone."""
    return when(parse_iso(iso), tz, seconds=True)


@get("/audit", opt=PUBLIC)
async def audit_page(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session, scope = await _owner_scope(request, sessions, auth)
    tz, problem = zone_or_utc(request.query_params)
    try:
        before = parse_cursor("audit", request.query_params.get("cursor"))
    except RequestError as exc:
        before, problem = None, exc.message
    found = await auth.admin.team_audit_page(scope.team.id, AUDIT_PAGE, before[1] if before else None)
    actors = await auth.directory.names(key_ids=[e.actor for e in found.data if not e.actor.startswith("cli:")],
                                        admin_names=scope.is_admin)
    return Template("audit.html.j2", status_code=400 if problem else 200, context={
        "session": session, "scope": scope, "page": "audit", "entries": found.data, "actors": actors,
        "prefix": display_prefix, "local": _local, "said": said, "next_cursor": found.next_cursor, "problem": problem,
        "tz": tz})


TEAM_HANDLERS = [audit_page]
