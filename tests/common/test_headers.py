"""Header lookups on the ASGI scope's raw pairs (common/headers.py), as the generation path makes them, checked
against what Litestar's own `connection.headers` answers for the same request."""

from __future__ import annotations

import pytest
from litestar.connection import ASGIConnection

from common.headers import header, header_values

RAW = [(b"host", b"gw"), (b"authorization", b"Bearer sk-1"), (b"x-forwarded-for", b"10.0.0.1, 10.0.0.2"),
       (b"x-forwarded-for", b"10.0.0.3"), (b"x-team-id", b""), (b"content-type", b"application/json; charset=\xe9")]


def connection(raw=RAW) -> ASGIConnection:
    return ASGIConnection({"type": "http", "headers": list(raw), "state": {}})


@pytest.mark.parametrize("name", ["authorization", "host", "x-team-id", "content-type", "x-forwarded-for", "absent"])
def test_the_first_value_is_litestars(name):
    assert header(connection(), name.encode()) == connection().headers.get(name)


def test_every_value_comes_in_order_as_litestar_gives_them():
    assert header_values(connection(), b"x-forwarded-for") == ["10.0.0.1, 10.0.0.2", "10.0.0.3"]
    assert header_values(connection(), b"x-forwarded-for") == connection().headers.getall("x-forwarded-for")
    assert header_values(connection(), b"absent") == []


def test_values_are_latin_1_as_http_sends_them():
    assert header(connection(), b"content-type") == "application/json; charset=\u00e9"


def test_an_empty_value_is_empty_not_missing():
    assert header(connection(), b"x-team-id") == ""
    assert header(connection([]), b"x-team-id") is None
