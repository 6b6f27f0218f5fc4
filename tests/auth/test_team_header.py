"""Which team pays: the X-Team-Id header (or its X-Friendli-Team alias), else the key's default team."""

from __future__ import annotations

import pytest

from auth import AuthError
from auth.admin import Actor
from auth.models import CreateKey, CreateTeam, CreateUser, Limits, PutMember
from tests.auth.helpers import add_member, assert_envelope, bearer, make_key, make_team, make_user

ACTOR = Actor(id="test", source="test")


async def test_personal_key_default_and_header_teams(client):
    user_id = await make_user(client)
    home, lab, stranger = (await make_team(client, "home"), await make_team(client, "lab"),
                           await make_team(client, "stranger"))
    await add_member(client, home, user_id, "owner")
    await add_member(client, lab, user_id)
    key = (await make_key(client, user_id=user_id, team_id=home))["key"]
    assert (await client.get("/v1/whoami", headers=bearer(key))).json()["team_id"] == home
    assert (await client.get("/v1/whoami", headers=bearer(key, lab))).json()["team_id"] == lab
    assert (await client.get("/v1/whoami", headers=bearer(key, lab, alias=True))).json()["team_id"] == lab
    body = (await client.get("/v1/whoami", headers=bearer(key))).json()
    assert body["user_id"] == user_id and not body["is_admin"]
    not_member = assert_envelope(await client.get("/v1/whoami", headers=bearer(key, stranger)), 403,
                                 "permission_denied")
    unknown = assert_envelope(await client.get("/v1/whoami", headers=bearer(key, "team_doesnotexist")), 403,
                              "permission_denied")
    # The two answers differ only by the echoed id: existence of a team is not revealed.
    assert not_member["message"].replace(stranger, "X") == unknown["message"].replace("team_doesnotexist", "X")


async def test_service_key_is_bound_to_its_team(client):
    team, other = await make_team(client, "svc"), await make_team(client, "other")
    key = (await make_key(client, team_id=team))["key"]
    assert (await client.get("/v1/whoami", headers=bearer(key))).json()["team_id"] == team
    assert (await client.get("/v1/whoami", headers=bearer(key, team))).json()["team_id"] == team
    assert_envelope(await client.get("/v1/whoami", headers=bearer(key, other)), 403, "permission_denied")


async def test_admin_key_may_name_any_existing_team(client):
    team = await make_team(client, "any")
    assert (await client.get("/v1/whoami", headers=client.admin_headers | {"X-Team-Id": team})).json()[
        "team_id"] == team
    assert_envelope(await client.get("/v1/whoami", headers=client.admin_headers | {"X-Team-Id": "team_nope"}),
                    403, "permission_denied")


async def test_model_not_allowed_is_403(client):
    key = (await make_key(client, team_id=client.boot.default_team_id, models=["m1", "m2"]))["key"]
    assert (await client.get("/v1/whoami?model=m2", headers=bearer(key))).status_code == 200
    assert_envelope(await client.get("/v1/whoami?model=m3", headers=bearer(key)), 403, "permission_denied")


async def test_principal_carries_key_and_team_limits(service):
    team = await service.admin.create_team(ACTOR, CreateTeam(name="lim", limits=Limits(rpm=10, tpm=100)))
    key = await service.admin.create_key(ACTOR, CreateKey(name="k", team_id=team.id,
                                                          limits=Limits(max_concurrency=2)))
    principal = await service.authenticate(f"Bearer {key.key}", None, "c")
    assert principal.team_limits == Limits(rpm=10, tpm=100)
    assert principal.key_limits == Limits(max_concurrency=2)


async def test_membership_removal_and_team_limit_change_apply_at_once(service):
    user = await service.admin.create_user(ACTOR, CreateUser(name="u"))
    home = await service.admin.create_team(ACTOR, CreateTeam(name="home"))
    lab = await service.admin.create_team(ACTOR, CreateTeam(name="lab"))
    for team in (home, lab):
        await service.admin.put_member(ACTOR, team.id, user.id, PutMember(role="member"))
    key = await service.admin.create_key(ACTOR, CreateKey(name="k", user_id=user.id, team_id=home.id))
    assert (await service.authenticate(f"Bearer {key.key}", lab.id, "c")).team_id == lab.id
    await service.admin.delete_member(ACTOR, lab.id, user.id)
    with pytest.raises(AuthError) as info:
        await service.authenticate(f"Bearer {key.key}", lab.id, "c")
    assert info.value.status == 403
    await service.admin.delete_member(ACTOR, home.id, user.id)  # the default team is gone too
    with pytest.raises(AuthError) as info:
        await service.authenticate(f"Bearer {key.key}", None, "c")
    assert info.value.status == 403
