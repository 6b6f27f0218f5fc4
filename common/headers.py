"""Request headers read straight from the ASGI scope's (lowercase name, value) pairs.

Litestar's `connection.headers` builds a multi-dict of every header on first use; a generation request only
looks up a handful of names, and building that multi-dict costs several times those lookups. ASGI
servers lowercase header names, so an exact byte match is the case-insensitive match HTTP asks for.
"""

from __future__ import annotations

from typing import Any

from litestar.connection import ASGIConnection


def header(connection: ASGIConnection[Any, Any, Any, Any], name: bytes) -> str | None:
    """The first value of the header `name` (lowercase), or None."""
    for key, value in connection.scope["headers"]:
        if key == name:
            return value.decode("latin-1")
    return None


def header_values(connection: ASGIConnection[Any, Any, Any, Any], name: bytes) -> list[str]:
    """Every value of the header `name` (lowercase), in the order they came."""
    return [value.decode("latin-1") for key, value in connection.scope["headers"] if key == name]
