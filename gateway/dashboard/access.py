"""What every dashboard request needs: its session (cookie), its signed-in key and scope, and its posted
form once the CSRF token matched."""

from __future__ import annotations

import secrets
from typing import Any

from litestar import Request
from litestar.datastructures import Cookie

from auth.models import KeyRecord
from auth.service import AuthService
from auth.sessions import LIFETIME_SECONDS, Session, SessionStore
from common.errors import BadRequest, PayloadTooLarge, SluiceError, UnsupportedMediaType
from gateway.dashboard.fields import ascii_whole
from gateway.dashboard.scope import DashboardScope, resolve

BASE = "/dashboard"
COOKIE = "sluice_session"  # HttpOnly, SameSite=Lax, Secure behind https: it holds only the session's id
MAX_FORM_BYTES = 8192
FORM = "application/x-www-form-urlencoded"


class Forbidden(SluiceError):
    status, type, code = 403, "permission_error", "forbidden"


def cookie(request: Request, session: Session | None) -> Cookie:
    secure = request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"
    if session is None:
        return Cookie(key=COOKIE, value="", path=BASE, max_age=0, httponly=True, samesite="lax", secure=secure)
    return Cookie(key=COOKIE, value=session.id, path=BASE, max_age=int(LIFETIME_SECONDS), httponly=True,
                  samesite="lax", secure=secure)


async def current_session(request: Request, sessions: SessionStore) -> Session | None:
    session = await sessions.get(request.cookies.get(COOKIE))
    request.state.dashboard_session = session  # an error page offers its sign-out form
    return session


def read_so_far(request: Request) -> tuple[Session | None, DashboardScope | None]:
    """The session and scope this request read, as far as it got: what an error page needs for its bar."""
    return getattr(request.state, "dashboard_session", None), getattr(request.state, "dashboard_scope", None)


def masked_token(session: Session) -> str:
    """The session's CSRF token under a fresh one-time pad, as a form carries it: a different string on every page,
    so a compressed page that also reflects what an attacker sent cannot give the token away (BREACH)."""
    token = session.csrf.encode()
    pad = secrets.token_bytes(len(token))
    return (pad + bytes(t ^ p for t, p in zip(token, pad, strict=True))).hex()


def _unmasked(value: Any) -> str | None:
    """The token a form's masked value carries (None: not one of ours)."""
    if not isinstance(value, str) or len(value) > 1024:
        return None
    try:
        raw = bytes.fromhex(value)
    except ValueError:
        return None
    half = len(raw) // 2
    if not half or len(raw) % 2:
        return None
    try:  # the tokens are ASCII (compare_digest takes no other str)
        return bytes(m ^ p for m, p in zip(raw[half:], raw[:half], strict=True)).decode("ascii")
    except UnicodeDecodeError:
        return None


async def session_form(request: Request, sessions: SessionStore) -> tuple[Session, dict[str, Any]]:
    """The request's session and its posted form (posted_form: 403 without a session whose CSRF token matches)."""
    session = await current_session(request, sessions)
    form = await posted_form(request, session)
    assert session is not None  # posted_form refused the request otherwise
    return session, form


async def posted_form(request: Request, session: Session | None) -> dict[str, Any]:
    """The posted form, once its CSRF token matched the session's."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != FORM:
        raise UnsupportedMediaType(f"Dashboard forms are sent as {FORM}.")
    length = ascii_whole(request.headers.get("content-length") or "0")
    if length is None or length > MAX_FORM_BYTES:
        raise PayloadTooLarge(f"A dashboard form holds at most {MAX_FORM_BYTES} bytes.")
    try:
        form = await request.form()
    except Exception as exc:  # the parser's own errors: nothing of ours went wrong
        raise BadRequest(f"This form could not be read ({type(exc).__name__}).") from exc
    token = _unmasked(form.get("csrf"))
    if session is None or token is None or not session.csrf_matches(token):
        raise Forbidden("This form has expired or did not come from this dashboard; reload the page and retry.")
    return dict(form)


async def signed_in(request: Request, sessions: SessionStore, auth: AuthService) -> tuple[Session, KeyRecord] | None:
    """The signed-in session and its key while the key is live; a revoked or expired key ends its sessions."""
    session = await current_session(request, sessions)
    if session is None or not session.signed_in:
        return None
    if session.user_id is not None:  # an account: its user's teams and roles (auth/directory.py)
        signer = await auth.directory.account_signer(session.user_id)
        if signer is None:
            await sessions.end_user(session.user_id)
            return None
        return session, signer
    key = await auth.directory.live_key(session.key_id)
    if key is None:
        await sessions.end_key(session.key_id)
        return None
    return session, key


class NotSignedIn(Exception):
    """A page asked for without a live signed-in session: the router answers with the sign-in page."""


async def signed_in_scope(request: Request, sessions: SessionStore,
                          auth: AuthService) -> tuple[Session, DashboardScope]:
    """The session and the scope of `?team_id=`; NotSignedIn without a live session."""
    found = await signed_in(request, sessions, auth)
    if found is None:
        raise NotSignedIn
    session, key = found
    scope = await resolve(auth, key, request.query_params.get("team_id") or None)
    request.state.dashboard_scope = scope  # an error page after this shows the whole bar
    return session, scope
