"""The /admin contract: users, teams, members, keys, with admin-only access and the error envelope."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import httpx
from litestar import Litestar
from litestar.datastructures import State

from gateway.admin.identity import admin_router
from gateway.authentication.middleware import STATE_KEY, authentication
from gateway.serving.dialect import DEFAULT
from tests.auth.helpers import add_member, assert_envelope, bearer, make_key, make_team, make_user


async def test_create_user_and_team(client):
    response = await client.post("/admin/users", json={"name": "alice"}, headers=client.admin_headers)
    assert response.status_code == 201 and response.json()["id"].startswith("usr_")
    limits = {"rpm": 60, "tpm": 1000, "max_concurrency": 4, "monthly_token_budget": 10**9}
    response = await client.post("/admin/teams", json={"name": "research", "limits": limits},
                                 headers=client.admin_headers)
    assert response.status_code == 201
    team = response.json()
    assert team["id"].startswith("team_") and team["limits"] == limits and team["name"] == "research"


async def test_patch_team_name_and_limits(client):
    team_id = await make_team(client, "t1", {"rpm": 5})
    response = await client.patch(f"/admin/teams/{team_id}", json={"limits": {"tpm": 7}},
                                  headers=client.admin_headers)
    assert response.status_code == 200 and response.json()["limits"] == {"tpm": 7}
    assert response.json()["name"] == "t1"
    response = await client.patch(f"/admin/teams/{team_id}", json={"name": "t2", "limits": None},
                                  headers=client.admin_headers)
    assert response.json()["name"] == "t2" and response.json()["limits"] is None
    key = await make_key(client, team_id=team_id)
    response = await client.get("/admin/teams", headers=client.admin_headers)
    assert "t2" in [t["name"] for t in response.json()["data"]]
    assert (await client.get("/v1/whoami", headers=bearer(key["key"]))).json()["team_id"] == team_id


async def test_membership_put_and_delete(client):
    user_id, team_id = await make_user(client), await make_team(client, "t")
    await add_member(client, team_id, user_id, "owner")
    members = (await client.get(f"/admin/teams/{team_id}/members", headers=client.admin_headers)).json()["data"]
    assert [(m["user_id"], m["role"]) for m in members] == [(user_id, "owner")]
    await add_member(client, team_id, user_id, "member")  # PUT again changes the role
    members = (await client.get(f"/admin/teams/{team_id}/members", headers=client.admin_headers)).json()["data"]
    assert [m["role"] for m in members] == ["member"]
    response = await client.delete(f"/admin/teams/{team_id}/members/{user_id}", headers=client.admin_headers)
    assert response.status_code == 200
    response = await client.delete(f"/admin/teams/{team_id}/members/{user_id}", headers=client.admin_headers)
    assert_envelope(response, 404, "member_not_found")


async def test_create_key_shapes(client):
    boot = client.boot
    service_key = await make_key(client, name="svc", team_id=boot.default_team_id, models=["m1"],
                                 limits={"rpm": 3}, expires_at="2999-01-01T00:00:00Z")
    assert {"id", "key", "prefix"} <= set(service_key)
    assert service_key["key"].startswith(service_key["prefix"] + "-")
    assert service_key["user_id"] is None and service_key["limits"] == {"rpm": 3}
    assert service_key["expires_at"].startswith("2999-01-01")
    user_id, team_id = await make_user(client), await make_team(client, "t")
    await add_member(client, team_id, user_id)
    personal = await make_key(client, user_id=user_id)  # the user's only team becomes the default
    assert personal["team_id"] == team_id and personal["user_id"] == user_id
    listed = (await client.get(f"/admin/keys?team_id={team_id}", headers=client.admin_headers)).json()["data"]
    assert [k["id"] for k in listed] == [personal["id"]]
    everything = (await client.get("/admin/keys", headers=client.admin_headers)).json()["data"]
    assert len(everything) == 4  # bootstrap admin + first key + the two above


async def test_non_admin_key_gets_403_on_every_admin_route(client):
    boot = client.boot
    headers = bearer(boot.first_key)
    for method, path in [("GET", "/admin/keys"), ("POST", "/admin/users"), ("GET", "/admin/audit"),
                         ("DELETE", "/admin/keys/abc"), ("PATCH", "/admin/teams/x"), ("GET", "/admin/teams")]:
        response = await client.request(method, path, headers=headers, json={"name": "x"})
        assert_envelope(response, 403, "permission_denied")
        assert response.json()["error"]["type"] == "permission_error"


async def test_admin_routes_without_or_with_bad_key_get_401(client):
    assert_envelope(await client.get("/admin/keys"), 401, "missing_api_key")
    response = await client.get("/admin/keys", headers=bearer("sk-sluice-000000000000-" + "a" * 32))
    error = assert_envelope(response, 401, "invalid_api_key")
    assert error["type"] == "authentication_error"


async def test_created_admin_key_works(client):
    admin2 = await make_key(client, name="ops", team_id=(await make_team(client, "ops")), is_admin=True)
    response = await client.get("/admin/keys", headers=bearer(admin2["key"]))
    assert response.status_code == 200


async def test_revoke_key(client):
    boot = client.boot
    key = await make_key(client, team_id=boot.default_team_id)
    assert (await client.get("/v1/whoami", headers=bearer(key["key"]))).status_code == 200
    response = await client.delete(f"/admin/keys/{key['id']}", headers=client.admin_headers)
    assert response.status_code == 200 and response.json()["revoked_at"] is not None
    assert_envelope(await client.get("/v1/whoami", headers=bearer(key["key"])), 401, "revoked_api_key")
    assert_envelope(await client.delete("/admin/keys/nope", headers=client.admin_headers), 404, "key_not_found")


async def test_router_with_an_already_open_service(service):
    """An app given the open service in its state (no lifespan), served on the service's own loop."""
    boot = await service.bootstrap(None)
    app = Litestar([admin_router()], middleware=[authentication()], exception_handlers=DEFAULT.exception_handlers(),
                   state=State({STATE_KEY: service}))
    transport = httpx.ASGITransport(app=app, client=("10.1.2.3", 5555))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        response = await http.post("/admin/users", json={"name": "zed"}, headers=bearer(boot.admin_key))
        assert response.status_code == 201
        assert_envelope(await http.get("/admin/users", headers=bearer(boot.first_key)), 403)
    entries = await service.admin.audit()
    assert (entries[0].action, entries[0].source) == ("users.create", "10.1.2.3")


async def test_every_401_over_http_uses_the_envelope(client):
    soon = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    expiring = await make_key(client, team_id=client.boot.default_team_id, expires_at=soon)
    await asyncio.sleep(1.1)
    cases = [({}, "missing_api_key"), ({"Authorization": "Basic abc"}, "invalid_api_key"),
             (bearer("sk-sluice-zz"), "invalid_api_key"),
             (bearer("sk-sluice-000000000000-" + "b" * 32), "invalid_api_key"),
             (bearer(expiring["key"]), "expired_api_key")]
    for headers, code in cases:
        error = assert_envelope(await client.get("/v1/whoami", headers=headers), 401, code)
        assert error["type"] == "authentication_error"
