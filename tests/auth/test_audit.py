"""GET /admin/audit: who did what to which target, when and from where, newest first."""

from __future__ import annotations

from datetime import datetime

from tests.auth.helpers import add_member, assert_envelope, bearer, make_key, make_team, make_user


async def test_every_admin_action_is_audited(client):
    admin_id = client.boot.admin_key.split("-")[2]
    user_id = await make_user(client)
    team_id = await make_team(client, "aud")
    await client.patch(f"/admin/teams/{team_id}", json={"limits": {"rpm": 1}}, headers=client.admin_headers)
    await add_member(client, team_id, user_id, "owner")
    key = await make_key(client, user_id=user_id, team_id=team_id)
    rotated = (await client.post(f"/admin/keys/{key['id']}/rotate", json={"grace_seconds": 5},
                                 headers=client.admin_headers)).json()
    await client.delete(f"/admin/keys/{rotated['id']}", headers=client.admin_headers)
    await client.delete(f"/admin/teams/{team_id}/members/{user_id}", headers=client.admin_headers)

    response = await client.get("/admin/audit", headers=client.admin_headers)
    assert response.status_code == 200
    entries = response.json()["data"]
    got = [(e["action"], e["target"]) for e in entries if e["actor"] == admin_id]
    assert got == [
        ("members.delete", f"{team_id}/{user_id}"),
        ("keys.revoke", rotated["id"]),
        ("keys.rotate", key["id"]),
        ("keys.create", key["id"]),
        ("members.put", f"{team_id}/{user_id}"),
        ("teams.update", team_id),
        ("teams.create", team_id),
        ("users.create", user_id),
    ]
    for entry in entries[:8]:
        assert entry["source"] == "testclient"  # the client address as Litestar sees it
        assert datetime.fromisoformat(entry["at"])
    assert entries[-1]["action"] == "bootstrap" and entries[-1]["actor"] == "system"
    rotate = next(e for e in entries if e["action"] == "keys.rotate")
    assert rotate["detail"] == {"new_key_id": rotated["id"], "grace_seconds": 5}


async def test_audit_pages_with_before_and_limit(client):
    for i in range(5):
        await make_user(client, f"u{i}")
    first = (await client.get("/admin/audit?limit=2", headers=client.admin_headers)).json()["data"]
    assert len(first) == 2
    rest = (await client.get(f"/admin/audit?limit=100&before={first[-1]['id']}",
                             headers=client.admin_headers)).json()["data"]
    assert len(rest) == 4 and rest[0]["id"] < first[-1]["id"]  # 3 more users + bootstrap


async def test_audit_is_admin_only(client):
    assert_envelope(await client.get("/admin/audit", headers=bearer(client.boot.first_key)), 403)
