"""Record pages and their cursors: stable while records keep arriving, and validated (#19: the
records API answers a page, never the whole window)."""

from __future__ import annotations

import asyncio
import csv
import io

import pytest

from billing.filters import Filters, Selection
from billing.insights.requests import MAX_PAGE_SIZE, Cursor, CursorError, page
from gateway.admin.usage import RECORDS_PAGE
from tests.billing.factory import usage
from tests.billing.http import auth, ts, usage_client

T0 = ts("2025-05-01T00:00:00")


async def fill(ledger, n: int, *, start: float = T0, team: str = "team-a", prefix: str = "r") -> list[str]:
    records = [usage(request_id=f"{prefix}-{i:05d}", team_id=team, time=start + i * 7.0) for i in range(n)]
    # ties on time are broken by request id: give a few records the very same instant
    records += [usage(request_id=f"{prefix}-tie-{i}", team_id=team, time=start + 70.0) for i in range(5)]
    for i in range(0, len(records), 100):
        await asyncio.gather(*(ledger.record(r) for r in records[i:i + 100]))
    await ledger.flush(10)
    return [r.request_id for r in records]


async def walk(ledger, selection: Selection, limit: int, *, newest_first: bool, between=None) -> list[str]:
    seen, cursor, pages = [], None, 0
    while True:
        result = await page(ledger.store, selection, limit, cursor, newest_first=newest_first)
        seen += [e.usage.request_id for e in result.entries]
        if result.next_cursor is None:
            return seen
        cursor = Cursor.decode(result.next_cursor, newest_first)
        pages += 1
        if between is not None:
            await between(pages)


@pytest.mark.parametrize("newest_first", [True, False])
async def test_pages_are_stable_while_records_arrive(ledger, newest_first):
    existing = await fill(ledger, 300)
    window = Selection(T0 - 86400, T0 + 86400, "team-a")

    async def insert_more(page_number: int) -> None:
        # newer and older records than the page boundary, and another team's, land between two reads
        await ledger.record(usage(request_id=f"late-new-{page_number}", team_id="team-a", time=T0 + 5000 + page_number))
        await ledger.record(usage(request_id=f"late-old-{page_number}", team_id="team-a", time=T0 - 100 - page_number))
        await ledger.record(usage(request_id=f"other-{page_number}", team_id="team-b", time=T0 + 10))
        await ledger.flush(10)

    seen = await walk(ledger, window, 37, newest_first=newest_first, between=insert_more)
    assert len(seen) == len(set(seen)), "a record was listed twice"
    assert set(existing) <= set(seen), "a record that existed at the first page was skipped"
    assert not any(rid.startswith("other-") for rid in seen)
    # the order is (time, request id), one direction or the other
    times = await ordered_keys(ledger, window, seen)
    assert times == sorted(times, reverse=newest_first)


async def ordered_keys(ledger, window, ids):
    everything = {e.usage.request_id: (e.usage.time, e.usage.request_id)
                  for e in (await page(ledger.store, window, MAX_PAGE_SIZE, newest_first=False)).entries}
    return [everything[i] for i in ids]


async def test_filters_apply_to_pages(ledger):
    await fill(ledger, 50)
    await ledger.record(usage(request_id="big-one", team_id="team-a", model="big", time=T0 + 3.0))
    await ledger.flush(10)
    only_big = await walk(ledger, Selection(T0, T0 + 86400, "team-a", Filters(models=("big",))), 10,
                          newest_first=True)
    assert only_big == ["big-one"]


def test_cursor_round_trip_and_refusals():
    cursor = Cursor(1.5, "req-1", True)
    assert Cursor.decode(cursor.encode(), True) == cursor
    for bad in ["", "!!!", "e30", "x" * 3000, Cursor(1.5, "r", False).encode()]:
        with pytest.raises(CursorError):
            Cursor.decode(bad, True)


async def test_records_api_pages_and_streams_csv(ledger):
    ids = await fill(ledger, 2600)
    window = {"start": "2025-04-30", "end": "2025-05-02"}
    async with usage_client(ledger) as client:
        r = await client.get("/admin/usage/records", params=window, headers=auth("root"))
        body = r.json()
        assert len(body["data"]) == RECORDS_PAGE and body["has_more"] is True  # never the whole window at once
        seen, cursor = [], None
        while True:
            params = {**window, "limit": "1000", **({"cursor": cursor} if cursor else {})}
            body = (await client.get("/admin/usage/records", params=params, headers=auth("root"))).json()
            seen += [row["request_id"] for row in body["data"]]
            cursor = body["next_cursor"]
            if cursor is None:
                assert body["has_more"] is False
                break
        assert seen == sorted(ids, key=lambda rid: (T0 + 70.0 if "tie" in rid else T0 + int(rid[2:]) * 7.0, rid))
        # the CSV is every record of the window, the JSON's values row for row, streamed
        async with client.stream("GET", "/admin/usage/records", params={**window, "format": "csv"},
                                 headers=auth("root")) as streamed:
            assert streamed.headers["content-type"].startswith("text/csv")
            text = "".join([chunk async for chunk in streamed.aiter_text()])
        rows = list(csv.DictReader(io.StringIO(text)))
        assert [row["request_id"] for row in rows] == seen
        first = (await client.get("/admin/usage/records", params={**window, "limit": "1"}, headers=auth("root"))).json()
        record = first["data"][0]
        assert {k: rows[0][k] for k in record} == {k: "" if v is None else str(v) for k, v in record.items()}
        assert rows[0]["cost"] == f"0.{record['cost_micros']:06d}"
        # a team's own requests page: newest first, its team only
        mine = (await client.get("/v1/usage/requests", params={**window, "limit": "5"}, headers=auth("a"))).json()
        assert [row["request_id"] for row in mine["data"]] == list(reversed(seen))[:5]
        theirs = (await client.get("/v1/usage/requests", params=window, headers=auth("b"))).json()
        assert theirs["data"] == [] and theirs["next_cursor"] is None


@pytest.mark.parametrize("params, param", [
    ({"limit": "0"}, "limit"), ({"limit": str(MAX_PAGE_SIZE + 1)}, "limit"), ({"limit": "ten"}, "limit"),
    ({"cursor": "not-a-cursor"}, "cursor"), ({"cursor": Cursor(1.0, "x", True).encode()}, "cursor"),
    ({"format": "xml"}, "format"), ({"status": "lost"}, "status"), ({"team_id": "t\x00"}, "team_id"),
    ({"model": "m" * 300}, "model"), ({"start": "1960-01-01"}, "start"), ({"end": "9999-12-31"}, "end"),
])
async def test_records_api_refuses_bad_parameters(ledger, params, param):
    async with usage_client(ledger) as client:
        r = await client.get("/admin/usage/records", params=params, headers=auth("root"))
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
