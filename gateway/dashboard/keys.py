"""The keys page of a team: owners (and the admin) list, create, rotate and revoke the team's keys through
the auth service's admin operations, which audit them; members get a 403 page. A new key's clear value is
shown once, on the page that answers the form, and never stored. Keys of another team answer 404."""

from __future__ import annotations

from litestar import Request, Response, get, post
from litestar.response import Redirect, Template

from auth.admin import Actor
from auth.http import body_as, client_address
from auth.middleware import PUBLIC
from auth.models import CreateKey, KeyCreated, KeyRecord, RotateKey
from auth.service import AuthService
from gateway.dashboard.access import (
    BASE,
    Forbidden,
    NotSignedIn,
    posted_form,
    signed_in_scope,
)
from gateway.dashboard.scope import Scope, key_is_live
from gateway.dashboard.sessions import Session, SessionStore
from gateway.errors import NotFound


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
    key = await auth.store.get_key(key_id)
    if key is None or key.team_id != scope.team.id or (key.is_admin and not scope.is_admin):
        raise NotFound("No such key in this team.", param="key_id", code="key_not_found")
    return key


def _actor(request: Request, session: Session, auth: AuthService) -> Actor:
    return Actor(id=session.key_id, source=f"dashboard:{client_address(request, auth.clients)}")


async def _page(auth: AuthService, session: Session, scope: Scope, created: KeyCreated | None = None,
                status: int = 200) -> Template:
    keys = [k for k in await auth.admin.list_keys(scope.team.id) if scope.is_admin or not k.is_admin]
    statuses = {k.id: _status(k) for k in await auth.store.list_keys(scope.team.id)}
    return Template("keys.html.j2", status_code=status, context={
        "session": session, "scope": scope, "keys": keys, "statuses": statuses, "created": created, "page": "keys"})


def _status(key: KeyRecord) -> str:
    if key.revoked_at is not None:
        return "revoked"
    if not key_is_live(key):
        return "expired"
    return "replaced (grace)" if key.replaced_by else "active"


@get("/keys", opt=PUBLIC)
async def keys_page(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    return await _page(auth, *await _owner_scope(request, sessions, auth))


@post("/keys/create", opt=PUBLIC, status_code=201)
async def create_key(request: Request, sessions: SessionStore, auth: AuthService) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    body = body_as({"name": form.get("name", ""), "team_id": scope.team.id,
                    "expires_at": form.get("expires_at") or None}, CreateKey)  # a service key of this team
    created = await auth.admin.create_key(_actor(request, session, auth), body)
    return await _page(auth, session, scope, created, status=201)


@post("/keys/{key_id:str}/rotate", opt=PUBLIC, status_code=201)
async def rotate_key(request: Request, sessions: SessionStore, auth: AuthService, key_id: str) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    await _team_key(auth, scope, key_id)
    grace = form.get("grace_seconds") or "0"
    body = body_as({"grace_seconds": int(grace) if grace.isdigit() else grace}, RotateKey)
    created = await auth.admin.rotate_key(_actor(request, session, auth), key_id, body)
    return await _page(auth, session, scope, created, status=201)


@post("/keys/{key_id:str}/revoke", opt=PUBLIC, status_code=303)
async def revoke_key(request: Request, sessions: SessionStore, auth: AuthService, key_id: str) -> Response:
    session, scope, _ = await _owner_form(request, sessions, auth)
    await _team_key(auth, scope, key_id)
    await auth.admin.revoke_key(_actor(request, session, auth), key_id)
    return Redirect(f"{BASE}/keys?team_id={scope.team.id}", status_code=303)


KEY_HANDLERS = [keys_page, create_key, rotate_key, revoke_key]
