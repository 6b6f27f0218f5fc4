"""The keys page: owners see every key that can act in their team and act on it through the auth service's
team-key operations (auth/team_keys.py), under the same rule as the team API (auth/policy.py): create, rotate
and revoke the team's service keys, block a member's personal key in this team; every action is audited.
Members get a 403 page. The admin sees the keys of every team (a team column, and `?keys_of=<team id>`
narrows the list) and acts on any of them; a key the owner's team cannot use answers 404. Each row offers
exactly the actions the rule allows. Rotate, revoke and block ask first on a page that says what will
happen; revoking the key the session is signed in with is refused (it would lock the viewer out).
A new key's clear value is shown once, on the page that answers the form, and never stored; that page
replaces its history entry with the plain keys page, so a reload makes no second key. The list is paged on
the server (`cursor`, as the admin API's). Each row shows the key's requests and spend in the chosen `range`
(the usage API's sums by key, in the view's window), its last use, its limits and model allow-list; the edit
form is key_edit.py."""

from __future__ import annotations

from datetime import date, datetime, time, timedelta
from urllib.parse import urlencode

import msgspec
import structlog
from litestar import Request, Response, get, post
from litestar.response import Redirect, Template
from markupsafe import Markup

from auth.admin import Actor
from auth.clock import now
from auth.errors import RequestError
from auth.keys import display_prefix
from auth.models import CreateTeamKey, KeyCreated, KeyRecord, RotateKey
from auth.paging import page, parse_cursor
from auth.policy import check_manages, sees_every_team, sees_key_whole
from auth.service import AuthService
from auth.sessions import Session, SessionStore
from auth.team_keys import OWN_KEY_BLOCK, ListedKey
from billing.insights.aggregate import usage_report
from billing.ledger import Ledger
from billing.timebuckets import zone
from billing.usage import UsageQuery, UsageRow
from common.errors import BadRequest
from gateway.authentication.headers import body_as, client_address
from gateway.authentication.middleware import PUBLIC
from gateway.dashboard.access import (
    BASE,
    Forbidden,
    NotSignedIn,
    posted_form,
    signed_in_scope,
)
from gateway.dashboard.budget_fields import FIELD_OF_PARAM, check_destinations
from gateway.dashboard.fields import whole_number
from gateway.dashboard.filters import RANGES, View, read_view_or_problem, zone_or_utc
from gateway.dashboard.key_grants import GRANT_FIELDS, read_grants
from gateway.dashboard.key_limits import budget_spend, limits_text, scope_of
from gateway.dashboard.render import when
from gateway.dashboard.scope import DashboardScope
from gateway.errors import NotFound
from gateway.serving.services import Services
from gateway.serving.spending import SpendReader

log = structlog.get_logger("gateway.dashboard")

PAGE = 200
CREATE_FIELDS = ("name", "expires_at", "expires_on")


class KeyRow(msgspec.Struct, frozen=True):
    id: str
    prefix: str
    name: str
    team: str  # the team's name
    owner: str  # the user's name, or "service"
    created: str
    last_used: str
    expires: str
    status: str
    actions: tuple[str, ...]  # what the viewer may do to it (auth/policy.py)
    usage: UsageRow  # its requests and spend in the view's window
    limits: Markup  # "rpm 60 · $50.00 a month, hard: $58.50 spent (117 %)", or "team's" (key_limits.py)
    models: str  # its allow-list, or "every model"
    blocked_in: tuple[tuple[str, str], ...] = ()  # the admin's list of every key: (id, name) of the teams blocking it


async def _owner_scope(request: Request, sessions: SessionStore, auth: AuthService) -> tuple[Session, DashboardScope]:
    session, scope = await signed_in_scope(request, sessions, auth)
    check_manages(scope.manager)  # the team API's rule and refusal (403)
    return session, scope


async def _owner_form(request: Request, sessions: SessionStore, auth: AuthService):
    """(session, scope, form) of an owner's posted form with this session's CSRF token."""
    try:
        session, scope = await _owner_scope(request, sessions, auth)
    except NotSignedIn:
        raise Forbidden("Sign in to manage keys.") from None
    return session, scope, await posted_form(request, session)


def _acting_team(scope: DashboardScope) -> str | None:
    """The team whose keys a form may name: the team on screen for an owner; any team (None) for the admin."""
    return None if sees_every_team(scope.is_admin) else scope.team.id


def _actor(request: Request, session: Session, auth: AuthService) -> Actor:
    return Actor(id=session.key_id, source=f"dashboard:{client_address(request, auth.clients)}")


async def _rows(auth: AuthService, ledger: Ledger, gate: SpendReader | None, scope: DashboardScope,
                listed: list[ListedKey], view: View, tz: str, own_key: str) -> list[KeyRow]:
    teams = {t.id: t.name for t in scope.teams}
    window = view.selection
    report = await usage_report(ledger.store, UsageQuery(window.start, window.end, window.team_id, "key"))
    used = {row.key: row for row in report.rows}

    def _at(unix: float | None) -> str:
        return when(unix, tz) if unix is not None else "never"

    users = await auth.directory.names(user_ids={item.key.user_id for item in listed if item.key.user_id})
    shown = [(item, _as_seen(item.key, scope)) for item in listed]
    spent = await budget_spend(gate, [k for _, k in shown if k.team_id])
    return [KeyRow(k.id, display_prefix(k.id), k.name, teams.get(k.team_id, k.team_id),
                   users.get(k.user_id, k.user_id) if k.user_id else "service", _at(k.created_at),
                   _at(k.last_used_at) if k.team_id else "—", _at(k.expires_at), _status(k, item.blocked),
                   _offered(item.actions, k.id, own_key), used.get(k.id, UsageRow(k.id)),
                   limits_text(k.limits, spent.get(scope_of(k))) if k.team_id else Markup(MADE_ELSEWHERE),
                   (", ".join(k.models) or "every model") if k.team_id else "—",
                   tuple((t, teams.get(t, t)) for t in item.blocked_in))
            for item, k in shown]


MADE_ELSEWHERE = "made in another team"  # its limits are that team's business


def _as_seen(key: KeyRecord, scope: DashboardScope) -> KeyRecord:
    """A member's personal key made in another team, as this team's owners see it: no team id, limits (a budget's
    webhook and e-mails), models or last use of that team's (the team API's rule, auth/views.py team_key_out);
    the admin sees every key whole."""
    if sees_key_whole(scope.is_admin, key.team_id, scope.team.id):
        return key
    return msgspec.structs.replace(key, team_id="", models=(), limits=None, last_used_at=None)


def _offered(actions: tuple[str, ...], key_id: str, own_key: str) -> tuple[str, ...]:
    """The key the viewer is signed in with offers neither revoke nor block: either would lock them out (both
    are refused)."""
    return tuple(a for a in actions if a not in ("revoke", "block")) if key_id == own_key else actions


async def _page(request: Request, auth: AuthService, ledger: Ledger, services: Services, session: Session,
                scope: DashboardScope, created: KeyCreated | None = None, status: int = 200,
                create_form: dict | None = None) -> Template:
    """The keys of the team on screen (the admin: of every team, or of `keys_of`), a page at a time. After a
    create or rotate (`created`), the new key is shown whatever happens to the list: the change is committed,
    and a key lost to a rendering error could only be rotated again."""
    keys_of = (request.query_params.get("keys_of") or None) if sees_every_team(scope.is_admin) else scope.team.id
    if keys_of is not None and keys_of not in {t.id for t in scope.teams}:
        raise NotFound("No such team on this dashboard.", param="keys_of", code="team_not_found")
    # the range and zone the other pages show (the header's link carries the zone); the usage of `keys_of`
    view = read_view_or_problem(request.query_params, keys_of)
    if view.problem is not None and status == 200:
        status = view.problem.status
    tz = view.tz if view.problem is None else "UTC"
    context = {"session": session, "scope": scope, "keys_of": keys_of, "tz": tz, "view": view, "ranges": RANGES,
               "created": created, "page": "keys", "rows": [], "next_cursor": None, "list_failed": False,
               "create_form": create_form or {}}
    try:
        listed = await _listed(request, auth, scope, keys_of)
        context.update(rows=await _rows(auth, ledger, services.spending, scope, listed.data, view, tz,
                                        session.key_id),
                       next_cursor=listed.next_cursor)
    except Exception:
        if created is None:
            raise
        log.exception("keys_list_failed", created=created.id)
        context["list_failed"] = True
    return Template("keys.html.j2", status_code=status, context=context)


async def _listed(request: Request, auth: AuthService, scope: DashboardScope, keys_of: str | None):
    """A page of keys: the team's (with their blocks there) for an owner and for the admin narrowed to a team;
    every key for the admin's "All teams" (with the teams each is blocked in)."""
    after = parse_cursor("keys", request.query_params.get("cursor"))
    manager = scope.manager
    if keys_of is None:
        found = await auth.team_keys.every_key(manager, None, PAGE + 1, after)
    else:
        found = await auth.team_keys.listed(manager, keys_of, PAGE + 1, after)  # the admin manages every team
    return page("keys", found, PAGE, lambda item: (item.key.created_at, item.key.id), lambda item: item)


def _status(key: KeyRecord, blocked: bool) -> str:
    if key.revoked_at is not None:
        return "revoked"
    if not key.is_live(now()):
        return "expired"
    if blocked:
        return "blocked in this team"
    return "replaced (grace)" if key.replaced_by else "active"


@get("/keys", opt=PUBLIC)
async def keys_page(request: Request, sessions: SessionStore, auth: AuthService, ledger: Ledger,
                    services: Services) -> Response:
    return await _page(request, auth, ledger, services, *await _owner_scope(request, sessions, auth))


def _expiry(typed: str, tz: str) -> str | None:
    """The form's "valid until" day (YYYY-MM-DD, the date picker's) as the API's ISO 8601 instant: the end of that
    day in the page's zone. None when left empty."""
    if not typed.strip():
        return None
    try:
        day = date.fromisoformat(typed.strip())
    except ValueError:
        raise RequestError(400, "invalid_expires_at", "Choose a day (YYYY-MM-DD), or leave it empty for a key "
                           "that does not expire.", "expires_on") from None
    return datetime.combine(day + timedelta(days=1), time(), zone(tz)).isoformat()


@post("/keys/create", opt=PUBLIC, status_code=201)
async def create_key(request: Request, sessions: SessionStore, auth: AuthService, ledger: Ledger,
                     services: Services) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    team_id = (form.get("team_id") or scope.team.id) if sees_every_team(scope.is_admin) else scope.team.id
    if team_id not in {t.id for t in scope.teams}:
        raise NotFound("No such team on this dashboard.", param="team_id", code="team_not_found")
    typed = {name: str(form.get(name, "")) for name in ("name", "expires_on", *GRANT_FIELDS)}
    errors: dict[str, str] = {}
    models, limits = read_grants(typed, errors)
    try:
        if errors:  # the first bad field, said at it
            raise RequestError(400, "invalid_field", *reversed(next(iter(errors.items()))))
        await check_destinations(request, limits, operator=scope.is_admin)
        expires_at = _expiry(typed["expires_on"], zone_or_utc(request.query_params)[0])
        body = body_as({"name": typed["name"], "expires_at": expires_at, "models": models,
                        "limits": msgspec.to_builtins(limits)}, CreateTeamKey)  # a service key of the team
        created = await auth.team_keys.create(_actor(request, session, auth), scope.manager, team_id, body)
    except (RequestError, BadRequest) as exc:
        param = FIELD_OF_PARAM.get(exc.param or "", exc.param)
        if param not in CREATE_FIELDS and param not in GRANT_FIELDS:
            raise
        # said at its field, the form as typed: nothing the owner wrote is thrown away
        field, message = ("expires_on", exc.message.replace("expires_at", "The day")) if param == "expires_at" \
            else (param, exc.message)
        return await _page(request, auth, ledger, services, session, scope, status=exc.status,
                           create_form={**typed, "team_id": team_id, "problem": (field, message)})
    return await _page(request, auth, ledger, services, session, scope, created, status=201)


def _confirm(session: Session, scope: DashboardScope, key: KeyRecord, action: str, consequence: str,
             back: str | None = None, **fields: str) -> Template:
    """The page that asks before a destructive action: the same form again, with `confirm=yes`."""
    question = f"{action.capitalize()} the key “{key.name}” ({display_prefix(key.id)})?"
    back = back or f"{BASE}/keys?" + urlencode({"team_id": scope.team.id})
    return Template("confirm.html.j2", status_code=200, context={
        "session": session, "scope": scope, "page": "keys", "question": question, "consequence": consequence,
        "action": f"{BASE}/keys/{key.id}/{action}?" + back.split("?", 1)[1], "verb": action.capitalize(),
        "fields": fields, "back": back})


def _confirmed(form) -> bool:
    return form.get("confirm") == "yes"


@post("/keys/{key_id:str}/rotate", opt=PUBLIC, status_code=201)
async def rotate_key(request: Request, sessions: SessionStore, auth: AuthService, ledger: Ledger,
                     services: Services, key_id: str) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    body = body_as({"grace_seconds": whole_number(form.get("grace_seconds") or "0", "grace_seconds")}, RotateKey)
    if not _confirmed(form):
        key = await auth.team_keys.may(scope.manager, _acting_team(scope), key_id, "rotate")
        ends = (f"keeps working for {body.grace_seconds:,} s, then stops" if body.grace_seconds
                else "stops at once")
        consequence = f"A new key replaces it; the old one {ends}."
        if key_id == session.key_id and not body.grace_seconds:
            consequence += " You are signed in with it: this session ends, sign in again with the new key."
        return _confirm(session, scope, key, "rotate", consequence, _keys_url(request, scope),
                        grace_seconds=str(body.grace_seconds))
    created = await auth.team_keys.rotate(_actor(request, session, auth), scope.manager, _acting_team(scope),
                                          key_id, body)
    return await _page(request, auth, ledger, services, session, scope, created, status=201)


@post("/keys/{key_id:str}/revoke", opt=PUBLIC, status_code=303)
async def revoke_key(request: Request, sessions: SessionStore, auth: AuthService, key_id: str) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    if key_id == session.key_id:
        raise RequestError(409, "own_key", "This is the key you are signed in with: revoking it would lock you out. "
                           "Sign in with another key of the team first.", "key_id")
    if not _confirmed(form):
        key = await auth.team_keys.may(scope.manager, _acting_team(scope), key_id, "revoke")
        return _confirm(session, scope, key, "revoke",
                        "Every request with it is refused from now on (401). This cannot be undone.",
                        _keys_url(request, scope))
    await auth.team_keys.revoke(_actor(request, session, auth), scope.manager, _acting_team(scope), key_id)
    return Redirect(_keys_url(request, scope), status_code=303)


async def _block(request: Request, sessions: SessionStore, auth: AuthService, key_id: str, blocked: bool) -> Response:
    """Block (or unblock) a personal key in the team on screen only (the admin: in the team `keys_of` shows)."""
    session, scope, form = await _owner_form(request, sessions, auth)
    if blocked and key_id == session.key_id:
        raise RequestError(409, "own_key", OWN_KEY_BLOCK, "key_id")
    if blocked and not _confirmed(form):
        key = await auth.team_keys.may(scope.manager, scope.team.id, key_id, "block")
        consequence = (f"Its requests for {scope.team.name} are refused until it is unblocked; its user's other "
                       "teams are not affected.")
        if key.user_id is not None and key.user_id == scope.key.user_id:
            consequence = f"This is one of your own keys. {consequence}"
        return _confirm(session, scope, key, "block", consequence, back=_keys_url(request, scope))
    await auth.team_keys.block(_actor(request, session, auth), scope.manager, scope.team.id, key_id, blocked=blocked)
    return Redirect(_keys_url(request, scope), status_code=303)


def _keys_url(request: Request, scope: DashboardScope) -> str:
    """The keys page the form came from: the team on screen (the admin's `keys_of` kept)."""
    keys_of = request.query_params.get("keys_of") if sees_every_team(scope.is_admin) else None
    tz = zone_or_utc(request.query_params)[0]
    return f"{BASE}/keys?" + urlencode({"team_id": scope.team.id, **({"keys_of": keys_of} if keys_of else {}),
                                        **({"tz": tz} if tz != "UTC" else {})})


@post("/keys/{key_id:str}/block", opt=PUBLIC, status_code=303)
async def block_key(request: Request, sessions: SessionStore, auth: AuthService, key_id: str) -> Response:
    return await _block(request, sessions, auth, key_id, blocked=True)


@post("/keys/{key_id:str}/unblock", opt=PUBLIC, status_code=303)
async def unblock_key(request: Request, sessions: SessionStore, auth: AuthService, key_id: str) -> Response:
    return await _block(request, sessions, auth, key_id, blocked=False)


KEY_HANDLERS = [keys_page, create_key, rotate_key, revoke_key, block_key, unblock_key]
