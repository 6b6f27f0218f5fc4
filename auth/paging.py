"""Pages of the admin lists (users, teams, keys, audit log), in the shape the usage records API pages with:
`limit` (1 to 1,000, default 100) and `cursor` (the previous page's `next_cursor`) in the query,
`{"object": "list", "data": [...], "has_more": ..., "next_cursor": ...}` in the answer. A cursor is opaque: the
position (creation time and id) of the last item of its page, and the listing that handed it out."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from auth.errors import RequestError

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
MAX_CURSOR_LENGTH = 1024

Position = tuple[float, str]  # (created_at, id): the order of users, teams and keys; the audit log's id alone


class PageOut(msgspec.Struct):
    data: list[Any]
    has_more: bool
    next_cursor: str | None  # None on the last page
    object: str = "list"


class _Cursor(msgspec.Struct, frozen=True, array_like=True):
    listing: str
    created_at: float
    id: str


def parse_limit(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    try:
        limit = int(raw)
    except ValueError:
        raise RequestError(400, "invalid_parameter", f"limit must be an integer, got {raw[:40]!r}", "limit") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise RequestError(400, "invalid_parameter", f"limit must be between 1 and {MAX_LIMIT}, got {limit}", "limit")
    return limit


def parse_cursor(listing: str, raw: str | None) -> Position | None:
    if not raw:
        return None
    try:
        if len(raw) > MAX_CURSOR_LENGTH:
            raise ValueError
        cursor = msgspec.msgpack.decode(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)), type=_Cursor)
    except (ValueError, binascii.Error, msgspec.DecodeError):
        raise RequestError(400, "invalid_parameter", "cursor is not one this API handed out", "cursor") from None
    if cursor.listing != listing:
        raise RequestError(400, "invalid_parameter", f"cursor belongs to the {cursor.listing} listing", "cursor")
    return cursor.created_at, cursor.id


def page(listing: str, rows: Sequence[Any], limit: int, position: Callable[[Any], Position],
         out: Callable[[Any], Any]) -> PageOut:
    """The answer for `rows` (up to limit + 1 of them, the extra one saying that more follow): `position(row)`
    is where a row stands, `out(row)` what the API shows of it."""
    shown = rows[:limit]
    more = len(rows) > limit
    cursor = None
    if more:
        created_at, row_id = position(shown[-1])
        packed = base64.urlsafe_b64encode(msgspec.msgpack.encode(_Cursor(listing, created_at, row_id)))
        cursor = packed.decode().rstrip("=")
    return PageOut([out(row) for row in shown], more, cursor)
