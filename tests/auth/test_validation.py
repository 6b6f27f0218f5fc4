"""Every admin body rule answers 4xx with a message naming the field, never a 500."""

from __future__ import annotations

import pytest

from tests.auth.helpers import add_member, assert_envelope, make_key, make_team, make_user

USER_CASES = [({}, "name"), ({"name": ""}, "name"), ({"name": "   "}, "name"), ({"name": 5}, "name"),
              ({"name": "a", "extra": 1}, "extra")]


@pytest.mark.parametrize(("body", "param"), USER_CASES)
async def test_user_body_rules(client, body, param):
    response = await client.post("/admin/users", json=body, headers=client.admin_headers)
    error = assert_envelope(response, 400, "invalid_request", param)
    assert param in error["message"]


async def test_malformed_json_is_400(client):
    response = await client.post("/admin/users", content=b"{not json", headers=client.admin_headers)
    assert_envelope(response, 400, "invalid_json")


@pytest.mark.parametrize(("body", "param"), [
    ({"name": "t", "limits": {"rpm": -1}}, "limits.rpm"),
    ({"name": "t", "limits": {"rpm": "many"}}, "limits.rpm"),
    ({"name": "t", "limits": {"qps": 3}}, "qps"),
    ({"limits": {}}, "name"),
])
async def test_team_body_rules(client, body, param):
    assert_envelope(await client.post("/admin/teams", json=body, headers=client.admin_headers), 400, param=param)


async def test_duplicate_team_name_is_409(client):
    await make_team(client, "dup")
    response = await client.post("/admin/teams", json={"name": "dup"}, headers=client.admin_headers)
    assert_envelope(response, 409, "team_exists", "name")


async def test_patch_team_rules(client):
    assert_envelope(await client.patch("/admin/teams/team_nope", json={"name": "x"}, headers=client.admin_headers),
                    404, "team_not_found", "team_id")
    team_id = await make_team(client, "p")
    await make_team(client, "taken")
    assert_envelope(await client.patch(f"/admin/teams/{team_id}", json={"name": ""}, headers=client.admin_headers),
                    400, param="name")
    assert_envelope(await client.patch(f"/admin/teams/{team_id}", json={"name": "taken"},
                                       headers=client.admin_headers), 409, "team_exists", "name")


async def test_member_rules(client):
    user_id, team_id = await make_user(client), await make_team(client, "m")
    path = f"/admin/teams/{team_id}/members/{user_id}"
    assert_envelope(await client.put(path, json={"role": "boss"}, headers=client.admin_headers), 400, param="role")
    assert_envelope(await client.put(path, json={}, headers=client.admin_headers), 400, param="role")
    assert_envelope(await client.put(f"/admin/teams/team_x/members/{user_id}", json={"role": "member"},
                                     headers=client.admin_headers), 404, "team_not_found", "team_id")
    assert_envelope(await client.put(f"/admin/teams/{team_id}/members/usr_x", json={"role": "member"},
                                     headers=client.admin_headers), 404, "user_not_found", "user_id")
    assert_envelope(await client.delete(f"/admin/teams/{team_id}/members/usr_x", headers=client.admin_headers),
                    404, "user_not_found", "user_id")


async def test_key_body_rules(client):
    boot = client.boot
    user_id, team_id, other = await make_user(client), await make_team(client, "k"), await make_team(client, "o")
    lonely = await make_user(client, "lonely")
    await add_member(client, team_id, user_id)
    await add_member(client, other, user_id)
    cases = [
        ({"team_id": team_id}, 400, "name"),
        ({"name": "k"}, 400, "team_id"),  # neither owner given
        ({"name": "k", "team_id": "team_nope"}, 400, "team_id"),
        ({"name": "k", "user_id": "usr_nope"}, 400, "user_id"),
        ({"name": "k", "user_id": user_id}, 400, "team_id"),  # two teams: which is the default?
        ({"name": "k", "user_id": lonely}, 400, "team_id"),  # no team at all
        ({"name": "k", "user_id": lonely, "team_id": team_id}, 400, "team_id"),  # not a member
        ({"name": "k", "team_id": team_id, "expires_at": "next tuesday"}, 400, "expires_at"),
        ({"name": "k", "team_id": team_id, "expires_at": "2001-01-01T00:00:00Z"}, 400, "expires_at"),
        ({"name": "k", "team_id": team_id, "expires_at": 12}, 400, "expires_at"),
        ({"name": "k", "team_id": team_id, "models": [""]}, 400, "models"),
        ({"name": "k", "team_id": team_id, "models": "m1"}, 400, "models"),
        ({"name": "k", "team_id": team_id, "limits": {"tpm": -5}}, 400, "limits.tpm"),
        ({"name": "k", "team_id": boot.default_team_id, "is_admin": "yes"}, 400, "is_admin"),
    ]
    for body, status, param in cases:
        response = await client.post("/admin/keys", json=body, headers=client.admin_headers)
        error = assert_envelope(response, status, param=param)
        assert param.split(".")[0] in error["message"], (body, error)
    assert len((await client.get("/admin/keys", headers=client.admin_headers)).json()["data"]) == 2


async def test_rotate_rules(client):
    key = await make_key(client, team_id=client.boot.default_team_id)
    path = f"/admin/keys/{key['id']}/rotate"
    assert_envelope(await client.post(path, json={"grace_seconds": -1}, headers=client.admin_headers),
                    400, param="grace_seconds")
    assert_envelope(await client.post(path, json={"grace_seconds": "soon"}, headers=client.admin_headers),
                    400, param="grace_seconds")
    assert_envelope(await client.post("/admin/keys/nope/rotate", json={}, headers=client.admin_headers),
                    404, "key_not_found")
    await client.delete(f"/admin/keys/{key['id']}", headers=client.admin_headers)
    assert_envelope(await client.post(path, json={}, headers=client.admin_headers), 409, "key_inactive")


async def test_bad_query_parameter_is_4xx_in_envelope(client):
    response = await client.get("/admin/audit?limit=lots", headers=client.admin_headers)
    assert_envelope(response, 400)
