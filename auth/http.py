"""HTTP helpers shared by the admin router and the authentication middleware: the team header, the
client address, and a decoded admin body checked against its struct."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import msgspec
from litestar.connection import ASGIConnection

from auth.errors import RequestError

TEAM_HEADERS = ("x-team-id", "x-friendli-team")  # X-Friendli-Team is accepted as an alias
_PARAM = re.compile(r"at `\$\.([A-Za-z_][\w.]*)|field `([A-Za-z_]\w*)`")


def team_header(headers: Mapping[str, str]) -> str | None:
    """The team a request asks to be billed to: the first non-empty team header."""
    for name in TEAM_HEADERS:
        value = headers.get(name)
        if value:
            return value
    return None


def client_address(connection: ASGIConnection) -> str:
    return connection.client.host if connection.client and connection.client.host else "unknown"


def body_as(payload: Any, type_: type):
    """A decoded JSON body (`common.json_body`) → its Struct; a mismatch is a 400 RequestError naming the field."""
    try:
        return msgspec.convert(payload, type_)
    except msgspec.ValidationError as exc:
        match = _PARAM.search(str(exc))
        param = (match.group(1) or match.group(2)) if match else None
        raise RequestError(400, "invalid_request", f"Invalid body: {exc}", param) from None
