"""A team's keys on both stores: the keys that can act in a team (members' personal keys made elsewhere
included), per-team blocks honoured by authentication in that team only, idempotent, inherited by rotation
(auth/team_keys.py; the whole rule against the real server is tests/security/test_tenant_keys.py); a key's
edit within the team's own limits, and the audit entries of one team."""

from __future__ import annotations

import pytest

from auth import AuthError, AuthService
from auth.admin import Actor
from auth.errors import RequestError
from auth.models import CreateKey, CreateTeam, CreateUser, EditKey, Limits, PutMember, RotateKey
from auth.policy import Manager

ACTOR = Actor(id="test", source="test")
OWNER = Manager(user_id=None, is_admin=False, role="owner")  # an owner's service key


async def _acts(service: AuthService, key: str, team: str) -> bool:
    try:
        await service.authenticate(f"Bearer {key}", team, "c")
    except AuthError:
        return False
    return True


async def test_team_keys_and_per_team_blocks(service: AuthService):
    ops = service.admin
    team_a, team_b = [(await ops.create_team(ACTOR, CreateTeam(name=n))).id for n in ("a", "b")]
    sam = (await ops.create_user(ACTOR, CreateUser(name="sam"))).id
    for team in (team_a, team_b):
        await ops.put_member(ACTOR, team, sam, PutMember(role="member"))
    personal = await ops.create_key(ACTOR, CreateKey(name="sam", team_id=team_a, user_id=sam))
    b_service = await ops.create_key(ACTOR, CreateKey(name="b", team_id=team_b))
    listed_b = {k.key.id: k for k in await service.team_keys.listed(OWNER, team_b)}
    assert set(listed_b) == {personal.id, b_service.id} and listed_b[personal.id].actions == ("block",)
    assert set(listed_b[b_service.id].actions) == {"rotate", "revoke", "edit"}

    for _ in range(2):  # idempotent; audited once
        out = await service.team_keys.block(ACTOR, OWNER, team_a, personal.id, blocked=True)
        assert out.blocked
    assert not await _acts(service, personal.key, team_a) and await _acts(service, personal.key, team_b)
    assert await service.store.blocked_teams(personal.id) == [team_a]
    blocks = [e for e in await ops.audit(50) if e.action == "keys.block"]
    assert [(e.target, e.detail["team_id"]) for e in blocks] == [(personal.id, team_a)]

    rotated = await ops.rotate_key(ACTOR, personal.id, RotateKey())
    assert not await _acts(service, rotated.key, team_a) and await _acts(service, rotated.key, team_b)
    await service.team_keys.block(ACTOR, OWNER, team_a, rotated.id, blocked=False)
    assert await _acts(service, rotated.key, team_a)
    assert [k.blocked for k in await service.team_keys.listed(OWNER, team_a) if k.key.id == rotated.id] == [False]


async def test_an_edit_stays_within_the_teams_limits_and_each_team_reads_its_own_audit(service: AuthService):
    ops = service.admin
    team = (await ops.create_team(ACTOR, CreateTeam(name="capped", limits=Limits(rpm=100)))).id
    other = (await ops.create_team(ACTOR, CreateTeam(name="other"))).id
    key = await ops.create_key(ACTOR, CreateKey(name="bot", team_id=team))
    theirs = await ops.create_key(ACTOR, CreateKey(name="theirs", team_id=other))
    with pytest.raises(RequestError) as above:
        await service.team_keys.edit(ACTOR, OWNER, team, key.id, EditKey(limits=Limits(rpm=101)))
    assert (above.value.status, above.value.param) == (403, "rpm")
    with pytest.raises(RequestError) as elsewhere:
        await service.team_keys.edit(ACTOR, OWNER, team, theirs.id, EditKey(name="mine"))
    assert elsewhere.value.status == 404
    out = await service.team_keys.edit(ACTOR, OWNER, team, key.id, EditKey(name="bot 2", limits=Limits(rpm=100),
                                                                           models=["small", "small"]))
    assert (out.name, out.limits, out.models) == ("bot 2", Limits(rpm=100), ["small"])
    stored = await service.store.get_key(key.id)
    assert (stored.name, stored.limits, stored.models) == ("bot 2", Limits(rpm=100), ("small",))

    entries = (await ops.team_audit_page(team, 100)).data
    assert {e.action for e in entries} == {"teams.create", "keys.create", "keys.edit"}
    assert theirs.id not in {e.target for e in entries} and other not in str([e.detail for e in entries])
    first = await ops.team_audit_page(team, 1)
    older = await ops.team_audit_page(team, 100, first.data[0].id)
    assert [e.id for e in first.data + older.data] == [e.id for e in entries]
    # `_` in an id is no LIKE wildcard: a look-alike id names no team
    assert (await ops.team_audit_page(team.replace("_", "x"), 100)).data == []
