"""What a team's owners can make the identity store keep is bounded, counted against the team and expires
(issue #43; auth/bounds.py states the rule):

- key records: an owner who creates and revokes (or rotates) keys in a loop is refused past the team's cap of
  records (409 `too_many_key_records`), and ended keys leave the record after their retention, so the keys
  table stays bounded; another team keeps making keys; usage names of a swept key degrade to its id;
- audit entries: an owner who floods audited changes is refused past the team's daily budget (429
  `too_many_changes` with Retry-After) instead of having the oldest entries deleted, so the trail of their own
  recent actions stays whole; revoking and blocking still work; another team's changes and trail are
  untouched; entries past the retention are swept.

On both stores in-process (a clock moved by days, as tests/auth/test_accounts.py moves it), and once against
the real `sluice serve` for the refusals' envelopes."""

from __future__ import annotations

import time

import httpx
import pytest

import auth.admin as admin_module
from auth import AuthService, RecordBounds
from auth.admin import Actor
from auth.bounds import DAY_S
from auth.errors import RequestError
from auth.models import CreateKey, CreateTeam, CreateTeamKey, CreateUser, EditKey, PutMember, RotateKey
from auth.policy import Manager
from testkit.admin import admin, wait_for_records
from tests.auth.helpers import PEPPER
from tests.security.stub_served import MODEL, sign_in, stub_served

OPERATOR = Actor(id="test", source="test")
OWNER = Manager(user_id=None, is_admin=False, role="owner")  # an owner's service key
MAX_LIVE, MAX_RECORDS, PER_DAY = 3, 8, 20
BOUNDS = RecordBounds(key_records=MAX_RECORDS, key_retention_s=90 * DAY_S, audit_retention_s=366 * DAY_S,
                      audit_per_day=PER_DAY)


@pytest.fixture
async def service(store_url):
    svc = await AuthService.open(store_url, PEPPER, max_keys_per_team=MAX_LIVE, record_bounds=BOUNDS)
    await svc.bootstrap(None)
    yield svc
    await svc.close()


def later(monkeypatch, days: float) -> None:
    """Every clock of the admin operations `days` ahead (revocations, creations, audit entries)."""
    monkeypatch.setattr(admin_module, "now", lambda: time.time() + days * DAY_S)


async def teams(service: AuthService) -> tuple[str, str, Actor, Actor]:
    """Teams A and B, each with an owner's service key acting (as the team API's actor)."""
    ids, actors = [], []
    for name in ("a", "b"):
        team = (await service.admin.create_team(OPERATOR, CreateTeam(name=name))).id
        key = await service.admin.create_key(OPERATOR, CreateKey(name=f"{name}-owner", team_id=team))
        ids.append(team)
        actors.append(Actor(id=key.id, source="test"))
    return ids[0], ids[1], actors[0], actors[1]


async def count(service: AuthService, sql: str, *params) -> int:
    row = await service.store.db.fetchone(sql, params)
    return int(row[0])


async def test_create_and_revoke_in_a_loop_is_refused_at_the_teams_cap_of_records(service, monkeypatch):
    team_a, team_b, ann, bea = await teams(service)
    made, refusal = [], None
    for index in range(5 * MAX_RECORDS):  # on main: every round succeeds, one more row each
        try:
            key = await service.team_keys.create(ann, OWNER, team_a, CreateTeamKey(name=f"churn-{index}"))
        except RequestError as exc:
            refusal = exc
            break
        made.append(key.id)
        await service.team_keys.revoke(ann, OWNER, team_a, key.id)
    assert refusal is not None and refusal.status == 409 and refusal.code == "too_many_key_records", made
    assert "max_key_records_per_team" in refusal.message and "90 days" in refusal.message
    rows = "SELECT COUNT(*) FROM api_keys WHERE team_id = ?"
    assert await count(service, rows, team_a) == MAX_RECORDS  # the owner's key + what the loop left
    # a rotation makes a record too: refused alike (the owner's own key is live, yet the team is full)
    with pytest.raises(RequestError) as rotated:
        await service.team_keys.rotate(ann, OWNER, team_a, ann.id, RotateKey())
    assert rotated.value.code == "too_many_key_records"
    # revoking stays possible, and the operator is not capped
    assert (await service.admin.create_key(OPERATOR, CreateKey(name="by-operator", team_id=team_a))).id
    # another team is untouched: its owner still makes keys
    assert (await service.team_keys.create(bea, OWNER, team_b, CreateTeamKey(name="b-works"))).id

    # 91 days on, the ended records leave as the next key is made: the owner makes keys again
    later(monkeypatch, 91)
    fresh = await service.team_keys.create(ann, OWNER, team_a, CreateTeamKey(name="after-retention"))
    assert await count(service, rows, team_a) == 3  # ann's key, the operator's, the fresh one
    assert await service.store.get_key(made[0]) is None
    # the usage ledger keeps a swept key's id: the dashboards find no name for it and show the id
    names = await service.directory.names([made[0], fresh.id])
    assert names == {fresh.id: "after-retention"}


async def test_rotation_in_a_loop_is_bounded_too(service, monkeypatch):
    team_a, _, ann, _ = await teams(service)
    current, rotations = ann.id, 0
    with pytest.raises(RequestError) as refused:
        for _ in range(5 * MAX_RECORDS):
            current = (await service.team_keys.rotate(ann, OWNER, team_a, current, RotateKey())).id
            rotations += 1
    assert refused.value.code == "too_many_key_records" and rotations == MAX_RECORDS - 1
    assert await count(service, "SELECT COUNT(*) FROM api_keys WHERE team_id = ?", team_a) == MAX_RECORDS
    later(monkeypatch, 91)  # the rotated-out keys expired at once (no grace): swept 90 days on
    await service.team_keys.rotate(ann, OWNER, team_a, current, RotateKey())
    assert await count(service, "SELECT COUNT(*) FROM api_keys WHERE team_id = ?", team_a) == 2


async def test_a_flood_of_audited_changes_is_refused_and_keeps_the_flooders_trail(service, monkeypatch):
    team_a, team_b, ann, bea = await teams(service)
    target = await service.team_keys.create(ann, OWNER, team_a, CreateTeamKey(name="bot"))
    done, refusal = 1, None  # the create above is one
    for index in range(10 * PER_DAY):  # renames: each one an entry, and no record
        try:
            await service.team_keys.edit(ann, OWNER, team_a, target.id, EditKey(name=f"bot-{index}"))
        except RequestError as exc:
            refusal = exc
            break
        done += 1
    assert refusal is not None and refusal.status == 429 and refusal.code == "too_many_changes"
    assert 0 < float(refusal.headers["retry-after"]) <= DAY_S and done == PER_DAY
    counted = "SELECT COUNT(*) FROM audit_log WHERE counted_team = ?"
    assert await count(service, counted, team_a) == PER_DAY
    # the refused change did not happen; every change made is still on the trail, newest first
    assert (await service.store.get_key(target.id)).name == f"bot-{done - 2}"
    trail = [e for e in await service.store.list_team_audit(team_a, 1000) if e.actor == ann.id]
    assert [e.detail.get("name") for e in trail if e.action == "keys.edit"] == \
        [f"bot-{index}" for index in reversed(range(done - 1))]
    # taking power away is never refused: revoking a live key, and a second revoke adds no entry
    for _ in range(2):
        await service.team_keys.revoke(ann, OWNER, team_a, target.id)
    revokes = [e for e in await service.store.list_team_audit(team_a, 1000) if e.action == "keys.revoke"]
    assert len(revokes) == 1
    # the other team's owners change their team, and their trail is whole; the operator is not counted
    await service.team_keys.create(bea, OWNER, team_b, CreateTeamKey(name="b-key"))
    assert [e.action for e in await service.store.list_team_audit(team_b, 1000)][:2] == ["keys.create"] * 2
    await service.admin.create_key(OPERATOR, CreateKey(name="operator-still", team_id=team_a))
    # a day on, the team's budget is back
    later(monkeypatch, 1.01)
    assert (await service.team_keys.create(ann, OWNER, team_a, CreateTeamKey(name="next-day"))).id


async def test_audit_entries_expire_after_the_retention(service, monkeypatch):
    team_a, _, ann, _ = await teams(service)
    for index in range(2):
        await service.team_keys.create(ann, OWNER, team_a, CreateTeamKey(name=f"k{index}"))
    # bootstrap, two teams, two owner keys, two creates
    assert await count(service, "SELECT COUNT(*) FROM audit_log") == 7
    later(monkeypatch, 367)
    user = (await service.admin.create_user(OPERATOR, CreateUser(name="late"))).id
    await service.admin.put_member(OPERATOR, team_a, user, PutMember(role="member"))
    assert [e.action for e in await service.admin.audit(100)] == ["members.put", "users.create"]


# --- the refusals through the real server, in the team API's envelope ---

ADMIN_KEY = "tenant-records-admin-key-0123456789ab"


def call(server, key: str, method: str, path: str, **body) -> httpx.Response:
    return httpx.request(method, f"{server.url}{path}", headers={"authorization": f"Bearer {key}"},
                         json=body or None, timeout=30)


def owners_of_two_teams(server) -> dict[str, str]:
    """Teams a and b, each with an owner holding a personal key the operator made (its clear value)."""
    owners = {}
    for name in ("a", "b"):
        team = admin(server, "POST", "/admin/teams", name=name)["id"]
        user = admin(server, "POST", "/admin/users", name=f"{name}-owner")["id"]
        admin(server, "PUT", f"/admin/teams/{team}/members/{user}", role="owner")
        owners[name] = admin(server, "POST", "/admin/keys", name=name, team_id=team, user_id=user)["key"]
    return owners


def test_create_and_revoke_through_the_team_api_stops_at_four_times_the_live_cap(tmp_path):
    # only the live cap is set: the records' cap defaults to 4 times it (on main the loop never stopped)
    with stub_served(tmp_path, ADMIN_KEY, config="max_keys_per_team = 2") as server:
        owners = owners_of_two_teams(server)
        made = None
        for index in range(30):
            made = call(server, owners["a"], "POST", "/v1/team/keys", name=f"churn-{index}")
            if made.status_code != 201:
                break
            assert call(server, owners["a"], "DELETE", f"/v1/team/keys/{made.json()['id']}").status_code == 200
        assert made.status_code == 409, made.text
        error = made.json()["error"]
        assert error["code"] == "too_many_key_records" and "max_key_records_per_team" in error["message"]
        assert index == 7  # the owner's personal key + 7 churned = 8 records
        team_a = call(server, owners["a"], "GET", "/v1/team").json()["id"]
        assert len(admin(server, "GET", f"/admin/keys?team_id={team_a}&limit=1000")["data"]) == 8
        # another team's owner is not held by A's records
        assert call(server, owners["b"], "POST", "/v1/team/keys", name="b-ok").status_code == 201


def test_a_flood_of_changes_through_the_team_api_gets_429_and_the_trail_stays(tmp_path):
    with stub_served(tmp_path, ADMIN_KEY, config="team_audit_entries_per_day = 12") as server:
        owners = owners_of_two_teams(server)
        ann = owners["a"]
        mine = call(server, ann, "GET", "/v1/team/keys").json()["data"][0]["id"]  # her own personal key
        answers = [call(server, ann, "PATCH", f"/v1/team/keys/{mine}", name=f"n{i}") for i in range(14)]
        assert [a.status_code for a in answers] == [200] * 12 + [429] * 2, [a.text for a in answers]
        refused = answers[-1]
        assert refused.json()["error"]["code"] == "too_many_changes" and int(refused.headers["retry-after"]) > 0
        # B still changes its keys; the log holds every change either team made, none pushed out
        key = call(server, owners["b"], "POST", "/v1/team/keys", name="b-ok").json()
        assert call(server, owners["b"], "PATCH", f"/v1/team/keys/{key['id']}", name="b-renamed").status_code == 200
        audit = admin(server, "GET", "/admin/audit?limit=1000")["data"]
        renames = [e["detail"]["name"] for e in audit if e["action"] == "keys.edit"]
        assert renames == ["b-renamed", *(f"n{i}" for i in reversed(range(12)))]


def test_a_swept_keys_usage_still_shows_on_the_teams_dashboard(tmp_path):
    # retention 0: a revoked key's record goes at the next key made, while the ledger keeps its usage
    with stub_served(tmp_path, ADMIN_KEY, config="key_retention_s = 0") as server:
        ann = owners_of_two_teams(server)["a"]
        made = call(server, ann, "POST", "/v1/team/keys", name="short-lived").json()
        answer = call(server, made["key"], "POST", "/v1/chat/completions", model=MODEL, max_tokens=1,
                      messages=[{"role": "user", "content": "hi"}])
        assert answer.status_code == 200, answer.text
        assert len(wait_for_records(server, 1)) == 1
        assert call(server, ann, "DELETE", f"/v1/team/keys/{made['id']}").status_code == 200
        assert call(server, ann, "POST", "/v1/team/keys", name="next").status_code == 201  # sweeps it
        assert made["id"] not in {k["id"] for k in call(server, ann, "GET", "/v1/team/keys").json()["data"]}
        refused = call(server, made["key"], "GET", "/v1/team")
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        with sign_in(server.url, ann) as dashboard:
            for page in ("/dashboard/overview", "/dashboard/requests"):
                shown = dashboard.get(page)
                assert shown.status_code == 200 and made["id"] in shown.text, (page, shown.text[:300])
