"""How a Litestar app authenticates with this package.

- `ApiKeyAuthentication` (middleware) sets `request.user` to the caller's `Principal` (bearer key + team
  header) and `request.auth` to its key id, on every route except those whose handler opts out with
  `opt=PUBLIC` and the paths given as `exclude`; a public route that tells a key apart calls
  `optional_principal`. It raises `AuthError` (401, 403, 429 with Retry-After)
  or `StoreUnavailable` (503), which the app renders in the envelope of the route that was called.
- `require_admin` is the guard of admin-only routes; `require_owner` of team management (an owner of the billed
  team, or an admin).
- The app keeps its opened `AuthService` in `app.state.auth`; `auth_service` provides it to handlers
  (`Provide(auth_service)` under the name `auth`).
"""

from __future__ import annotations

from litestar.connection import ASGIConnection
from litestar.datastructures import State
from litestar.handlers import BaseRouteHandler
from litestar.middleware import AbstractAuthenticationMiddleware, AuthenticationResult, DefineMiddleware

from auth.errors import AuthError
from auth.policy import check_manages, uses_admin_api
from auth.service import AuthService, Principal
from common.headers import header
from gateway.authentication.headers import client_address, team_header

PUBLIC = {"exclude_from_auth": True}  # `opt` of a route anyone may call without a key
STATE_KEY = "auth"


def auth_service(state: State) -> AuthService:
    return state[STATE_KEY]


async def principal(connection: ASGIConnection) -> Principal:
    """The caller a request's key and team header name; raises AuthError or StoreUnavailable."""
    service = auth_service(connection.app.state)
    return await service.authenticate(authorization(connection), team_header(connection),
                                      client_address(connection, service.clients))


def authorization(connection: ASGIConnection) -> str | None:
    """The key as `Authorization: Bearer <key>`, or as `x-api-key: <key>` (how the Anthropic SDKs send it) when
    no Authorization header is sent."""
    sent = header(connection, b"authorization")
    if sent is None and (api_key := header(connection, b"x-api-key")) is not None:
        return f"Bearer {api_key}"
    return sent


class ApiKeyAuthentication(AbstractAuthenticationMiddleware):
    async def authenticate_request(self, connection: ASGIConnection) -> AuthenticationResult:
        caller = await principal(connection)
        return AuthenticationResult(user=caller, auth=caller.key_id)


async def optional_principal(connection: ASGIConnection) -> Principal | None:
    """The caller of a PUBLIC route: None without a key; with one, its principal (whose allow-list and team
    then apply), and a bad key the same 401 as on any route."""
    if authorization(connection) is None:
        return None
    return await principal(connection)


async def is_admin_caller(connection: ASGIConnection) -> bool:
    """Whether a PUBLIC route's caller holds an admin key (a bad key is the usual 401)."""
    caller = await optional_principal(connection)
    return caller is not None and uses_admin_api(caller.is_admin)


def authentication(exclude: list[str] | None = None) -> DefineMiddleware:
    """The middleware for an app's `middleware` list; `exclude`: path patterns served without a key."""
    return DefineMiddleware(ApiKeyAuthentication, exclude=exclude)


def require_admin(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    if not uses_admin_api(connection.user.is_admin):
        raise AuthError.denied("This API needs an admin key.")


def require_owner(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    """Team management: an owner of the billed team (or an admin key), the refusal of auth/policy.py."""
    check_manages(connection.user.manager)
