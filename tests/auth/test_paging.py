"""GET /admin/users, /admin/teams, /admin/keys and /admin/audit answer a page at a time (`limit`, default 100,
at most 1,000; `cursor` from the previous page's `next_cursor`), in the usage records API's shape; walking the
pages yields every item once, in order. Bad values answer 400 naming `limit` or `cursor`."""

from __future__ import annotations

import pytest

from tests.auth.helpers import assert_envelope, make_key, make_team, make_user

LISTINGS = ["/admin/users", "/admin/teams", "/admin/keys", "/admin/audit"]


async def walk(client, path: str, limit: int, **params) -> list[dict]:
    items: list[dict] = []
    cursor = None
    while True:
        query = {"limit": limit, **params} | ({"cursor": cursor} if cursor else {})
        body = (await client.get(path, params=query, headers=client.admin_headers)).json()
        assert body["object"] == "list" and len(body["data"]) <= limit
        assert body["has_more"] == (body["next_cursor"] is not None)
        items += body["data"]
        cursor = body["next_cursor"]
        if cursor is None:
            return items


@pytest.fixture
async def populated(client):
    users = [await make_user(client, f"user{i}") for i in range(5)]
    teams = [await make_team(client, f"team{i}") for i in range(4)]
    for i in range(5):
        await make_key(client, name=f"key{i}", team_id=teams[i % 2])
    return client, users, teams


@pytest.mark.parametrize("path", LISTINGS)
async def test_pages_walk_the_whole_listing_once_in_order(populated, path):
    client, _, _ = populated
    whole = (await client.get(path, params={"limit": 1000}, headers=client.admin_headers)).json()
    assert whole["has_more"] is False and whole["next_cursor"] is None and len(whole["data"]) >= 5
    for limit in (1, 2, 3):
        assert await walk(client, path, limit) == whole["data"]


async def test_keys_of_one_team_page_within_that_team(populated):
    client, _, teams = populated
    paged = await walk(client, "/admin/keys", 2, team_id=teams[0])
    assert [k["name"] for k in paged] == ["key0", "key2", "key4"] and {k["team_id"] for k in paged} == {teams[0]}


async def test_the_default_page_is_a_hundred(client):
    for i in range(101):
        await make_user(client, f"many{i}")
    body = (await client.get("/admin/users", headers=client.admin_headers)).json()
    assert len(body["data"]) == 100 and body["has_more"]


async def test_the_audit_log_still_pages_with_before(populated):
    client, _, _ = populated
    first = (await client.get("/admin/audit", params={"limit": 2}, headers=client.admin_headers)).json()
    older = (await client.get("/admin/audit", params={"limit": 1000, "before": first["data"][-1]["id"]},
                              headers=client.admin_headers)).json()
    assert first["data"] + older["data"] == await walk(client, "/admin/audit", 1000)


@pytest.mark.parametrize("limit", ["0", "1001", "lots"])
@pytest.mark.parametrize("path", LISTINGS)
async def test_a_bad_limit_is_400(client, path, limit):
    assert_envelope(await client.get(path, params={"limit": limit}, headers=client.admin_headers), 400,
                    "invalid_parameter", "limit")


@pytest.mark.parametrize("cursor", ["garbage!", "x" * 2000])
@pytest.mark.parametrize("path", LISTINGS)
async def test_a_cursor_not_handed_out_is_400(client, path, cursor):
    assert_envelope(await client.get(path, params={"cursor": cursor}, headers=client.admin_headers), 400,
                    "invalid_parameter", "cursor")


async def test_a_cursor_of_another_listing_is_400(populated):
    client, _, _ = populated
    cursor = (await client.get("/admin/users", params={"limit": 1}, headers=client.admin_headers)).json()["next_cursor"]
    response = await client.get("/admin/teams", params={"cursor": cursor}, headers=client.admin_headers)
    assert "users" in assert_envelope(response, 400, "invalid_parameter", "cursor")["message"]
