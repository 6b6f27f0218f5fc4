"""Pages of ledger records, newest first (the requests page) or oldest first (the records API), with
a cursor: the page's last (time, request_id). A page is read by key, never by offset, so records
that arrive between two pages neither repeat nor push others off a page; a page costs the same
however deep it is."""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator

import msgspec

from billing.filters import Selection, where
from billing.records import LedgerEntry
from billing.store.base import ENTRY_COLUMNS, TABLE, UsageStore, row_entry
from storage.sql_dialect import Params

MAX_PAGE_SIZE = 10_000  # a page's rows are held in memory: this bounds one answer's size (~6 MB of JSON)


class CursorError(ValueError):
    pass


class Cursor(msgspec.Struct, frozen=True, array_like=True):
    time: float
    request_id: str
    newest_first: bool

    def encode(self) -> str:
        return base64.urlsafe_b64encode(msgspec.msgpack.encode(self)).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str, newest_first: bool) -> Cursor:
        """The cursor a previous page of the same order handed out; CursorError for anything else."""
        try:
            if len(text) > 2048:
                raise ValueError
            cursor = msgspec.msgpack.decode(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)), type=cls)
        except (ValueError, binascii.Error, msgspec.DecodeError):
            raise CursorError("cursor is not one this API handed out") from None
        if cursor.newest_first != newest_first:
            raise CursorError("cursor belongs to a listing in the other order")
        return cursor


class Page(msgspec.Struct):
    entries: list[LedgerEntry]
    next_cursor: str | None  # None on the last page


async def page(store: UsageStore, selection: Selection, limit: int, cursor: Cursor | None = None, *,
               newest_first: bool = True) -> Page:
    """Up to `limit` records of the view after `cursor`, and the cursor of the next page."""
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE_SIZE}")
    params = Params(store.dialect)
    condition = where(selection, params)
    order = "DESC" if newest_first else "ASC"
    if cursor is not None:
        condition += (f" AND (time, request_id) {'<' if newest_first else '>'} "
                      f"({params(cursor.time)}, {params(cursor.request_id)})")
    rows = await store.fetch(f"SELECT {ENTRY_COLUMNS} FROM {TABLE} WHERE {condition} "
                             f"ORDER BY time {order}, request_id {order} LIMIT {params(limit + 1)}", params.values)
    entries = [row_entry(r) for r in rows[:limit]]
    last = entries[-1].usage if len(rows) > limit else None
    return Page(entries, Cursor(last.time, last.request_id, newest_first).encode() if last else None)


async def every_page(store: UsageStore, selection: Selection, batch: int = 2000, *,
                     newest_first: bool = False) -> AsyncIterator[list[LedgerEntry]]:
    """Every record of the view, one page of `batch` at a time (exports: memory stays bounded, and no
    read transaction stays open while a slow client drains them)."""
    cursor = None
    while True:
        result = await page(store, selection, batch, cursor, newest_first=newest_first)
        if result.entries:
            yield result.entries
        if result.next_cursor is None:
            return
        last = result.entries[-1].usage
        cursor = Cursor(last.time, last.request_id, newest_first)


async def one(store: UsageStore, team_id: str | None, request_id: str) -> LedgerEntry | None:
    """The record of `request_id` if it belongs to `team_id` (None: any team, the admin's): another team's
    id is answered exactly as an unknown one."""
    params = Params(store.dialect)
    condition = f"request_id = {params(request_id)}"
    if team_id is not None:
        condition += f" AND team_id = {params(team_id)}"
    rows = await store.fetch(f"SELECT {ENTRY_COLUMNS} FROM {TABLE} WHERE {condition}", params.values)
    return row_entry(rows[0]) if rows else None


async def sent_as(store: UsageStore, team_id: str, client_request_id: str, limit: int = 2) -> list[LedgerEntry]:
    """The team's records whose caller sent `client_request_id` as its own X-Request-Id, newest first (`limit` of
    them: a caller may send one id twice); another team's are never among them."""
    params = Params(store.dialect)
    rows = await store.fetch(f"SELECT {ENTRY_COLUMNS} FROM {TABLE} WHERE team_id = {params(team_id)} AND "
                             f"client_request_id = {params(client_request_id)} ORDER BY time DESC, request_id DESC "
                             f"LIMIT {int(limit)}", params.values)
    return [row_entry(row) for row in rows]
