"""Sign-in through the operator's identity provider (Settings' `[oidc]`): OpenID Connect's authorization code flow
with PKCE (S256), a state and a nonce per attempt, and the ID token checked against the provider's JWKS
(auth/id_tokens.py). The person lands in the account whose address the token vouches for (`email` with
`email_verified`); a provider's user without an account is told to ask for an invitation (no account is made).

The attempt's state, nonce and code verifier travel in a cookie of their own (HttpOnly, SameSite=Lax, path
/dashboard/oidc, ten minutes), tagged with the pepper (`AuthService.tag`): the callback accepts only the state
that this browser started (the cookie is cleared once it signed in), so a link with someone else's code signs nobody in.
The provider's discovery document and JWKS are fetched on each attempt (a rotated key is picked up at once)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from urllib.parse import urlencode

import httpx
import msgspec
import structlog
from litestar import Request, Response, get
from litestar.datastructures import Cookie
from litestar.response import Redirect

from auth.errors import RequestError
from auth.id_tokens import IdTokenRefused, verify
from auth.service import AuthService
from auth.sessions import SessionStore
from gateway.authentication.headers import client_address
from gateway.authentication.middleware import PUBLIC
from gateway.config import OidcSettings, Settings
from gateway.dashboard.access import BASE, cookie, current_session
from gateway.errors import NotFound
from gateway.serving.services import Services

log = structlog.get_logger("gateway.dashboard.oidc")
COOKIE = "sluice_oidc"
ATTEMPT_S = 600.0
TIMEOUT_S = 10.0
MAX_PARAM = 2000


class Attempt(msgspec.Struct, frozen=True):
    state: str
    nonce: str
    verifier: str
    expires_at: float


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _config(services: Services) -> OidcSettings:
    oidc = services.settings.oidc
    if not oidc.issuer:
        raise NotFound("Sign-in through an identity provider is not configured here.", code="oidc_off")
    return oidc


def _callback_url(settings: Settings) -> str:
    base = settings.public_url.rstrip("/") or f"http://{settings.host}:{settings.port}"
    return f"{base}{BASE}/oidc/callback"


async def _discover(oidc: OidcSettings) -> dict:
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        answer = await client.get(f"{oidc.issuer.rstrip('/')}/.well-known/openid-configuration")
        answer.raise_for_status()
        found = answer.json()
    if not isinstance(found, dict) or found.get("issuer") != oidc.issuer:
        raise RequestError(502, "oidc_provider", "The identity provider's discovery document names another issuer.")
    return found


def _refused(why: str) -> RequestError:
    return RequestError(400, "oidc_refused", f"Sign-in through the identity provider failed: {why}. Start again.")


def _provider_failed(exc: Exception) -> RequestError:
    log.warning("oidc_provider_failed", error=type(exc).__name__)
    return RequestError(502, "oidc_provider", "The identity provider could not be reached; try again later.")


@get("/oidc/start", opt=PUBLIC)
async def start(request: Request, auth: AuthService, services: Services) -> Response:
    oidc = _config(services)
    try:
        found = await _discover(oidc)
    except (httpx.HTTPError, ValueError) as exc:
        raise _provider_failed(exc) from exc
    attempt = Attempt(secrets.token_urlsafe(32), secrets.token_urlsafe(32), secrets.token_urlsafe(48),
                      time.time() + ATTEMPT_S)
    payload = _b64(msgspec.json.encode(attempt))
    query = urlencode({"response_type": "code", "client_id": oidc.client_id, "scope": "openid email",
                       "redirect_uri": _callback_url(services.settings), "state": attempt.state,
                       "nonce": attempt.nonce, "code_challenge_method": "S256",
                       "code_challenge": _b64(hashlib.sha256(attempt.verifier.encode()).digest())})
    secure = request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"
    held = Cookie(key=COOKIE, value=f"{payload}.{auth.tag('oidc', payload)}", path=f"{BASE}/oidc",
                  max_age=int(ATTEMPT_S), httponly=True, samesite="lax", secure=secure)
    return Redirect(f"{found['authorization_endpoint']}?{query}", status_code=302, cookies=[held])


def _attempt(request: Request, auth: AuthService) -> Attempt:
    held = request.cookies.get(COOKIE) or ""
    payload, _, tag = held.partition(".")
    if not payload or len(held) > MAX_PARAM or not hmac.compare_digest(tag, auth.tag("oidc", payload)):
        raise _refused("this browser did not start it")
    attempt = msgspec.json.decode(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)), type=Attempt)
    if attempt.expires_at < time.time():
        raise _refused("it took longer than ten minutes")
    return attempt


async def _id_token(oidc: OidcSettings, found: dict, code: str, verifier: str,
                    redirect_uri: str) -> tuple[str, dict]:
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        answer = await client.post(found["token_endpoint"], data={
            "grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri,
            "client_id": oidc.client_id, "code_verifier": verifier}, auth=(oidc.client_id, oidc.client_secret))
        if answer.status_code != 200:
            raise _refused(f"the provider refused the code ({answer.status_code})")
        token = answer.json().get("id_token")
        jwks = (await client.get(found["jwks_uri"])).json()
    if not isinstance(token, str):
        raise _refused("the provider sent no ID token")
    return token, jwks


@get("/oidc/callback", opt=PUBLIC)
async def callback(request: Request, sessions: SessionStore, auth: AuthService, services: Services) -> Response:
    oidc = _config(services)
    attempt = _attempt(request, auth)
    params = request.query_params
    if params.get("error"):
        raise _refused(f"the provider said {str(params.get('error'))[:100]!r}")
    state, code = params.get("state") or "", params.get("code") or ""
    if not hmac.compare_digest(state.encode(), attempt.state.encode()):
        raise _refused("the state is not this browser's")
    if not code or len(code) > MAX_PARAM:
        raise _refused("the provider sent no code")
    try:
        found = await _discover(oidc)
        token, jwks = await _id_token(oidc, found, code, attempt.verifier, _callback_url(services.settings))
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        raise _provider_failed(exc) from exc
    try:
        claims = verify(token, jwks, issuer=oidc.issuer, client_id=oidc.client_id, nonce=attempt.nonce,
                        now=time.time())
    except IdTokenRefused as exc:
        log.warning("oidc_token_refused", why=str(exc))
        raise _refused(f"its ID token was refused ({exc})") from exc
    email = claims.get("email")
    if claims.get("email_verified") is not True or not isinstance(email, str):
        raise _refused("the provider vouches for no e-mail address")
    account = await auth.store.account_by_email(email.strip().lower()[:254])
    if account is None:
        raise RequestError(403, "no_account", "No account has this e-mail address here: ask a team's owner for "
                           "an invitation.")
    old = await current_session(request, sessions)
    if old is not None and old.signed_in:
        await sessions.end(old.id)
    signed = await sessions.start(user_id=account.user_id, client=client_address(request, auth.clients),
                                  agent=request.headers.get("user-agent", ""))
    spent = Cookie(key=COOKIE, value="", path=f"{BASE}/oidc", max_age=0, httponly=True, samesite="lax")
    return Redirect(f"{BASE}/overview", status_code=303, cookies=[cookie(request, signed), spent])


OIDC_HANDLERS = [start, callback]
