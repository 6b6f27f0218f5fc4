"""The keys page: owners list, create, rotate and revoke their team's keys through the auth service's admin
operations, which audit them; members get a 403 page. The admin sees the keys of every team (a team column,
and `?keys_of=<team id>` narrows the list) and acts on any of them; an owner's key of another team answers 404.
A new key's clear value is shown once, on the page that answers the form, and never stored. The list is paged
on the server (`cursor`, as the admin API's)."""

from __future__ import annotations

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Redirect, Template

from auth.admin import Actor
from auth.http import body_as, client_address
from auth.keys import display_prefix
from auth.middleware import PUBLIC
from auth.models import CreateKey, KeyCreated, KeyRecord, RotateKey
from auth.paging import page, parse_cursor
from auth.service import AuthService
from gateway.dashboard.access import (
    BASE,
    Forbidden,
    NotSignedIn,
    posted_form,
    signed_in_scope,
)
from gateway.dashboard.fields import whole_number
from gateway.dashboard.render import when
from gateway.dashboard.scope import Scope, key_is_live
from gateway.dashboard.sessions import Session, SessionStore
from gateway.errors import NotFound

PAGE = 200


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


async def _owner_scope(request: Request, sessions: SessionStore, auth: AuthService) -> tuple[Session, Scope]:
    session, scope = await signed_in_scope(request, sessions, auth)
    if not scope.manages_keys:
        raise Forbidden("Managing keys needs the team's owner role.")
    return session, scope


async def _owner_form(request: Request, sessions: SessionStore, auth: AuthService):
    """(session, scope, form) of an owner's posted form with this session's CSRF token."""
    try:
        session, scope = await _owner_scope(request, sessions, auth)
    except NotSignedIn:
        raise Forbidden("Sign in to manage keys.") from None
    return session, scope, await posted_form(request, session)


async def _team_key(auth: AuthService, scope: Scope, key_id: str):
    """A key the scope may act on: the admin any key, an owner a non-admin key of the team on screen."""
    key = await auth.store.get_key(key_id)
    if key is None or not scope.is_admin and (key.team_id != scope.team.id or key.is_admin):
        raise NotFound("No such key in this team.", param="key_id", code="key_not_found")
    return key


def _actor(request: Request, session: Session, auth: AuthService) -> Actor:
    return Actor(id=session.key_id, source=f"dashboard:{client_address(request, auth.clients)}")


async def _rows(auth: AuthService, scope: Scope, keys: list[KeyRecord]) -> list[KeyRow]:
    teams = {t.id: t.name for t in scope.teams}
    users: dict[str, str] = {}
    for user_id in {k.user_id for k in keys if k.user_id is not None}:
        user = await auth.store.get_user(user_id)
        users[user_id] = user.name if user is not None else user_id
    return [KeyRow(k.id, display_prefix(k.id), k.name, teams.get(k.team_id, k.team_id),
                   users[k.user_id] if k.user_id else "service", _at(k.created_at), _at(k.last_used_at),
                   _at(k.expires_at), _status(k)) for k in keys]


def _at(unix: float | None) -> str:
    return when(unix, "UTC") if unix is not None else "never"


async def _page(request: Request, auth: AuthService, session: Session, scope: Scope,
                created: KeyCreated | None = None, status: int = 200) -> Template:
    """The keys of the team on screen (the admin: of every team, or of `keys_of`), a page at a time."""
    keys_of = (request.query_params.get("keys_of") or None) if scope.is_admin else scope.team.id
    if keys_of is not None and keys_of not in {t.id for t in scope.teams}:
        raise NotFound("No such team on this dashboard.", param="keys_of", code="team_not_found")
    after = parse_cursor("keys", request.query_params.get("cursor"))
    listed = page("keys", await auth.store.list_keys(keys_of, PAGE + 1, after), PAGE, lambda k: (k.created_at, k.id),
                  lambda k: k)
    keys = [k for k in listed.data if scope.is_admin or not k.is_admin]
    return Template("keys.html.j2", status_code=status, context={
        "session": session, "scope": scope, "rows": await _rows(auth, scope, keys), "keys_of": keys_of,
        "next_cursor": listed.next_cursor, "created": created, "page": "keys"})


def _status(key: KeyRecord) -> str:
    if key.revoked_at is not None:
        return "revoked"
    if not key_is_live(key):
        return "expired"
    return "replaced (grace)" if key.replaced_by else "active"


@get("/keys", opt=PUBLIC)
async def keys_page(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    return await _page(request, auth, *await _owner_scope(request, sessions, auth))


@post("/keys/create", opt=PUBLIC, status_code=201)
async def create_key(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    team_id = (form.get("team_id") or scope.team.id) if scope.is_admin else scope.team.id  # the admin: any team
    if team_id not in {t.id for t in scope.teams}:
        raise NotFound("No such team on this dashboard.", param="team_id", code="team_not_found")
    body = body_as({"name": form.get("name", ""), "team_id": team_id,
                    "expires_at": form.get("expires_at") or None}, CreateKey)  # a service key of this team
    created = await auth.admin.create_key(_actor(request, session, auth), body)
    return await _page(request, auth, session, scope, created, status=201)


@post("/keys/{key_id:str}/rotate", opt=PUBLIC, status_code=201)
async def rotate_key(request: Request, sessions: SessionStore, auth: AuthService, key_id: str) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    await _team_key(auth, scope, key_id)
    body = body_as({"grace_seconds": whole_number(form.get("grace_seconds") or "0", "grace_seconds")}, RotateKey)
    created = await auth.admin.rotate_key(_actor(request, session, auth), key_id, body)
    return await _page(request, auth, session, scope, created, status=201)


@post("/keys/{key_id:str}/revoke", opt=PUBLIC, status_code=303)
async def revoke_key(request: Request, sessions: SessionStore, auth: AuthService, key_id: str) -> Response:
    session, scope, _ = await _owner_form(request, sessions, auth)
    await _team_key(auth, scope, key_id)
    await auth.admin.revoke_key(_actor(request, session, auth), key_id)
    return Redirect(f"{BASE}/keys?team_id={scope.team.id}", status_code=303)


KEY_HANDLERS = [keys_page, create_key, rotate_key, revoke_key]
