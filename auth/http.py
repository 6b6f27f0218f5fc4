"""HTTP helpers shared by the admin router and the gateway: team header, client address, error response."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import msgspec
from litestar import Response
from litestar.connection import ASGIConnection

from auth.errors import AuthError, RequestError, envelope

TEAM_HEADERS = ("x-team-id", "x-friendli-team")  # X-Friendli-Team is accepted as an alias
_PARAM = re.compile(r"at `\$\.([A-Za-z_][\w.]*)|field `([A-Za-z_]\w*)`")


def team_header(headers: Mapping[str, str]) -> str | None:
    for name in TEAM_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


def client_address(connection: ASGIConnection) -> str:
    return connection.client.host if connection.client and connection.client.host else "unknown"


def error_response(exc: AuthError | RequestError) -> Response:
    headers = {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(exc.retry_after)))
    return Response(envelope(exc), status_code=exc.status, headers=headers)


def decode_body(raw: bytes, type_: type, *, empty_ok: bool = False):
    """JSON body → Struct; errors become a 400 RequestError naming the field."""
    if not raw.strip():
        raw = b"{}" if empty_ok else raw
    try:
        return msgspec.json.decode(raw, type=type_)
    except msgspec.ValidationError as exc:
        match = _PARAM.search(str(exc))
        param = (match.group(1) or match.group(2)) if match else None
        raise RequestError(400, "invalid_request", f"Invalid body: {exc}", param) from None
    except msgspec.DecodeError as exc:
        raise RequestError(400, "invalid_json", f"Body is not valid JSON: {exc}") from None
