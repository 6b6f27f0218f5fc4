"""HTTP helpers shared by the admin router and the authentication middleware: the team header, the real
client address, and a decoded admin body checked against its struct."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar.connection import ASGIConnection

from auth.errors import RequestError
from auth.forwarded import ClientAddresses
from common.errors import invalid_field
from common.headers import header, header_values

TEAM_HEADERS = (b"x-team-id", b"x-friendli-team")  # X-Friendli-Team is accepted as an alias


def team_header(connection: ASGIConnection) -> str | None:
    """The team a request asks to be billed to: the first non-empty team header."""
    for name in TEAM_HEADERS:
        value = header(connection, name)
        if value:
            return value
    return None


def client_address(connection: ASGIConnection, clients: ClientAddresses) -> str:
    """The real client: the peer, or the hop `X-Forwarded-For` names when the peer is a trusted proxy."""
    peer = connection.scope.get("client") or ("unknown",)
    return clients.client(peer[0] or "unknown", header_values(connection, b"x-forwarded-for"))


def body_as(payload: Any, type_: type):
    """A decoded JSON body (`common.json_body`) → its Struct; a mismatch is a 400 RequestError naming the field."""
    try:
        return msgspec.convert(payload, type_)
    except msgspec.ValidationError as exc:
        raise RequestError(400, "invalid_request", f"Invalid body: {exc}",
                           invalid_field(exc, top_level=False)) from None
