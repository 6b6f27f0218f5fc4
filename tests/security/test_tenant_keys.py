"""Tenant ↔ tenant through a shared member, against the real `sluice serve`: the owner of team A, whose team
shares a user with team B, tries every path of the team API and of the dashboard to get a key's secret or any
power in B, and gets none. B's owners see every key that can act in B; a block of a personal key in A leaves
the user's B access intact; every action is in the audit log (auth/policy.py states the rule).

The cast: Ann owns A. Sam is a member of A and an owner of B; Sam's personal key was made in A (its default
team is A, so B's old listing did not show it). Bea owns B. B also has a service key.

What an owner sees of a key is this team's business only: a member's personal key made in another team is
listed without that team's id, limits (a budget's webhook and e-mails), models or last use; a team's alert
destinations are shown to its owners, not its members; the `default` team's owners see nothing of the admin
keys that live in it. Bounds: at most `max_keys_per_team` live keys made by owners in a team; the listing is
paged."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

import httpx
import pytest

from testkit.admin import admin
from tests.security.stub_served import MODEL, csrf_of, sign_in, stub_served

ADMIN_KEY = "tenant-keys-admin-key-0123456789abcdef"
MAX_KEYS = 12
HOOK = "https://hooks.slack.example/services/T0B/B0B/b-teams-webhook-secret"
SECRET = re.compile(r"sk-sluice-[0-9a-f]{12}-[a-z2-7]{32}")


@dataclass
class Cast:
    team_a: str
    team_b: str
    sam: str  # Sam's user id
    ann_key: str
    sam_key: dict  # as the operator created it (id, key)
    bea_key: str
    b_service: dict


def call(server, key: str, method: str, path: str, team: str | None = None, **body) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}", **({"x-team-id": team} if team else {})}
    return httpx.request(method, f"{server.url}{path}", headers=headers, json=body or None, timeout=30)


def acts_in(server, key: str, team: str) -> bool:
    """Whether `key` is served in `team`: its team view, and a completion billed to it."""
    view = call(server, key, "GET", "/v1/team", team)
    completion = call(server, key, "POST", "/v1/chat/completions", team, model=MODEL, max_tokens=1,
                      messages=[{"role": "user", "content": "hi"}])
    assert view.status_code == completion.status_code, (view.text, completion.text)
    return view.status_code == 200


def key_id(clear: str) -> str:
    return clear.split("-")[2]  # sk-sluice-<id>-<secret>


def listed_ids(server, key: str, team: str | None = None) -> dict[str, dict]:
    response = call(server, key, "GET", "/v1/team/keys", team)
    assert response.status_code == 200, response.text
    return {k["id"]: k for k in response.json()["data"]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with stub_served(tmp_path_factory.mktemp("tenant-keys"), ADMIN_KEY,
                     config=f"max_keys_per_team = {MAX_KEYS}") as running:
        yield running


@pytest.fixture
def cast(server, request) -> Cast:
    tag = request.node.name[-40:]
    team_a = admin(server, "POST", "/admin/teams", name=f"A-{tag}")["id"]
    team_b = admin(server, "POST", "/admin/teams", name=f"B-{tag}")["id"]
    users = {name: admin(server, "POST", "/admin/users", name=f"{name}-{tag}")["id"] for name in ("ann", "sam", "bea")}
    for team, user, role in ((team_a, "ann", "owner"), (team_a, "sam", "member"), (team_b, "sam", "owner"),
                             (team_b, "bea", "owner")):
        admin(server, "PUT", f"/admin/teams/{team}/members/{users[user]}", role=role)
    key = {name: admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team, user_id=users[name])
           for name, team in (("ann", team_a), ("sam", team_a), ("bea", team_b))}
    b_service = admin(server, "POST", "/admin/keys", name="b-service", team_id=team_b)
    return Cast(team_a, team_b, users["sam"], key["ann"]["key"], key["sam"], key["bea"]["key"], b_service)


def test_the_owner_of_a_gets_no_secret_and_no_power_in_b_through_the_team_api(server, cast):
    ann, sam_id = cast.ann_key, cast.sam_key["id"]
    before_b = listed_ids(server, cast.bea_key)
    # minting a personal key for the shared member: the old back door
    minted = call(server, ann, "POST", "/v1/team/keys", name="backdoor", user_id=cast.sam)
    assert minted.status_code == 403 and "operator" in minted.text and not SECRET.search(minted.text)
    # rotating the member's key, to receive its successor's secret
    rotated = call(server, ann, "POST", f"/v1/team/keys/{sam_id}/rotate")
    assert rotated.status_code == 403 and "Block it in this team" in rotated.text and not SECRET.search(rotated.text)
    # revoking it, which would cut the member off in B as well
    assert call(server, ann, "DELETE", f"/v1/team/keys/{sam_id}").status_code == 403
    # B's own keys, named from A, are not A's to touch
    for path in (f"/v1/team/keys/{cast.b_service['id']}", f"/v1/team/keys/{cast.b_service['id']}/block"):
        assert call(server, ann, "DELETE", path).status_code == 404
    assert call(server, ann, "POST", f"/v1/team/keys/{cast.b_service['id']}/rotate").status_code == 404
    # nor does Ann's key reach B at all, nor a service key she makes in A
    own_service = call(server, ann, "POST", "/v1/team/keys", name="a-ci")
    assert own_service.status_code == 201 and own_service.json()["user_id"] is None
    for key in (ann, own_service.json()["key"]):
        assert not acts_in(server, key, cast.team_b)
        assert call(server, key, "GET", "/v1/team/keys", cast.team_b).status_code == 403
    # the member's key still works everywhere, unchanged; B holds exactly the keys it held
    assert acts_in(server, cast.sam_key["key"], cast.team_a) and acts_in(server, cast.sam_key["key"], cast.team_b)
    after_b = listed_ids(server, cast.bea_key)
    assert after_b.keys() == before_b.keys() and not after_b[sam_id]["revoked_at"]


def test_bs_owners_see_every_key_that_can_act_in_b_without_secrets(server, cast):
    listing = call(server, cast.bea_key, "GET", "/v1/team/keys")
    assert listing.status_code == 200 and not SECRET.search(listing.text)
    listed = {k["id"]: k for k in listing.json()["data"]}
    # Sam's key was made in A, yet it acts in B: B's owners see it
    assert cast.sam_key["id"] in listed and listed[cast.sam_key["id"]]["made_here"] is False
    assert cast.b_service["id"] in listed and not any(k["is_admin"] for k in listed.values())
    # a new personal key of Sam's, wherever the operator makes it, shows up in B too
    later = admin(server, "POST", "/admin/keys", name="sam-second", team_id=cast.team_a, user_id=cast.sam)
    assert later["id"] in listed_ids(server, cast.bea_key)
    # and Ann's key, which cannot act in B, does not
    assert key_id(cast.ann_key) not in listed and key_id(cast.ann_key) in listed_ids(server, cast.ann_key)


def test_a_block_in_a_leaves_the_members_b_access_intact_and_survives_rotation(server, cast):
    sam_key, sam_id = cast.sam_key["key"], cast.sam_key["id"]
    blocked = call(server, cast.ann_key, "POST", f"/v1/team/keys/{sam_id}/block")
    assert blocked.status_code == 200 and blocked.json()["blocked"] is True and not SECRET.search(blocked.text)
    assert call(server, sam_key, "GET", "/v1/team", cast.team_a).status_code == 403
    assert "blocked in team" in call(server, sam_key, "GET", "/v1/team").text  # its default team is A
    assert not acts_in(server, sam_key, cast.team_a)
    assert acts_in(server, sam_key, cast.team_b)
    assert listed_ids(server, cast.ann_key)[sam_id]["blocked"] is True
    assert listed_ids(server, cast.bea_key)[sam_id]["blocked"] is False
    # Sam, an owner in B, may rotate Sam's own key there (and gets its secret); the successor stays blocked in A
    rotated = call(server, sam_key, "POST", f"/v1/team/keys/{sam_id}/rotate", cast.team_b, grace_seconds=0)
    assert rotated.status_code == 201, rotated.text
    successor = rotated.json()["key"]
    assert acts_in(server, successor, cast.team_b) and not acts_in(server, successor, cast.team_a)
    # a service key is revoked, not blocked; blocking is idempotent; unblocking restores A only for that key
    a_service = call(server, cast.ann_key, "POST", "/v1/team/keys", name="a-svc").json()
    assert call(server, cast.ann_key, "POST", f"/v1/team/keys/{a_service['id']}/block").status_code == 403
    new_id = rotated.json()["id"]
    assert call(server, cast.ann_key, "POST", f"/v1/team/keys/{new_id}/block").status_code == 200
    assert call(server, cast.ann_key, "DELETE", f"/v1/team/keys/{new_id}/block").json()["blocked"] is False
    assert acts_in(server, successor, cast.team_a)
    # members cannot block
    assert call(server, successor, "POST", f"/v1/team/keys/{new_id}/block", cast.team_a).status_code == 403


def test_no_key_blocks_itself_through_the_team_api(server, cast):
    """A key that blocked itself lost the team at once, and only the operator's API could give it back."""
    ann_id = key_id(cast.ann_key)
    refused = call(server, cast.ann_key, "POST", f"/v1/team/keys/{ann_id}/block", reason="oops")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "own_key", refused.text
    assert "lock you out" in refused.json()["error"]["message"]
    assert acts_in(server, cast.ann_key, cast.team_a)
    assert listed_ids(server, cast.ann_key)[ann_id]["blocked"] is False
    # nor in another team it owns
    sam_b = call(server, cast.sam_key["key"], "POST", f"/v1/team/keys/{cast.sam_key['id']}/block", cast.team_b)
    assert sam_b.status_code == 409, sam_b.text


def test_the_dashboard_is_no_second_back_door(server, cast):
    sam_id = cast.sam_key["id"]
    with sign_in(server.url, cast.ann_key) as ann, sign_in(server.url, cast.sam_key["key"]) as sam:
        page = ann.get("/dashboard/keys")
        assert page.status_code == 200 and sam_id in page.text and not SECRET.search(page.text)
        row = re.search(rf'<tr data-key-id="{sam_id}">.*?</tr>', page.text, re.S).group(0)
        assert 'data-action="block"' in row and "rotate" not in row and "revoke" not in row
        csrf = csrf_of(page.text)
        for action in ("rotate", "revoke"):
            refused = ann.post(f"/dashboard/keys/{sam_id}/{action}", data={"csrf": csrf, "grace_seconds": "0"})
            assert refused.status_code == 403 and not SECRET.search(refused.text), (action, refused.text[:300])
        # the create form makes a service key of A, whatever else it is sent
        made = ann.post("/dashboard/keys/create", data={"csrf": csrf, "name": "form", "user_id": cast.sam,
                                                        "team_id": cast.team_b})
        assert made.status_code == 201
        service = [k for k in listed_ids(server, cast.ann_key).values() if k["name"] == "form"]
        assert [(k["user_id"], k["team_id"]) for k in service] == [(None, cast.team_a)]
        # B, and B's keys, are not on A's owner's dashboard
        assert ann.get("/dashboard/keys", params={"team_id": cast.team_b}).status_code == 404
        for action in ("rotate", "revoke", "block"):
            for query in ("", f"?team_id={cast.team_b}"):
                assert ann.post(f"/dashboard/keys/{cast.b_service['id']}/{action}{query}",
                                data={"csrf": csrf, "grace_seconds": "0"}).status_code == 404, (action, query)
        assert sam.get("/dashboard/overview", params={"team_id": cast.team_a}).status_code == 200
        blocked = ann.post(f"/dashboard/keys/{sam_id}/block", data={"csrf": csrf, "confirm": "yes"},
                           follow_redirects=True)
        assert blocked.status_code == 200 and "blocked in this team" in blocked.text
        # Sam's signed-in session loses A at once, and keeps B
        assert sam.get("/dashboard/overview", params={"team_id": cast.team_a}).status_code == 404
        assert sam.get("/dashboard/overview", params={"team_id": cast.team_b}).status_code == 200
    assert not acts_in(server, cast.sam_key["key"], cast.team_a) and acts_in(server, cast.sam_key["key"], cast.team_b)
    # B's owners see Sam's key on their keys page, without its secret
    with sign_in(server.url, cast.bea_key) as bea:
        page = bea.get("/dashboard/keys")
        assert sam_id in page.text and not SECRET.search(page.text)


def test_every_action_is_in_the_audit_log(server, cast):
    sam_id = cast.sam_key["id"]
    created = call(server, cast.ann_key, "POST", "/v1/team/keys", name="audited").json()
    call(server, cast.ann_key, "POST", f"/v1/team/keys/{created['id']}/rotate")
    call(server, cast.ann_key, "DELETE", f"/v1/team/keys/{created['id']}")
    for bad in ({"reason": "x" * 201}, {"until": "forever"}):  # a clear 400, nothing blocked
        refused = call(server, cast.ann_key, "POST", f"/v1/team/keys/{sam_id}/block", **bad)
        assert refused.status_code == 400 and "Invalid body" in refused.text, refused.text
    assert listed_ids(server, cast.ann_key)[sam_id]["blocked"] is False
    call(server, cast.ann_key, "POST", f"/v1/team/keys/{sam_id}/block", reason="left the project")
    call(server, cast.ann_key, "DELETE", f"/v1/team/keys/{sam_id}/block")
    entries = [e for e in admin(server, "GET", "/admin/audit?limit=200")["data"]
               if e["actor"] == key_id(cast.ann_key)]
    seen = {(e["action"], e["target"], e["detail"].get("team_id")) for e in entries}
    assert {("keys.create", created["id"], cast.team_a), ("keys.rotate", created["id"], cast.team_a),
            ("keys.revoke", created["id"], cast.team_a), ("keys.block", sam_id, cast.team_a),
            ("keys.unblock", sam_id, cast.team_a)} <= seen
    assert [e["detail"]["reason"] for e in entries if e["action"] == "keys.block"] == ["left the project"]
    assert all(not SECRET.search(str(e)) for e in entries)


def _switcher(page: str) -> dict[str, str]:
    """The dashboard's team switcher: team id -> the role it shows."""
    return {team: role for team, role in re.findall(r'<option value="([^"]+)"[^>]*>[^<]* \(([a-z]+)\)</option>', page)}


def _api_roles(server, key: str, teams: list[str]) -> dict[str, str]:
    """The teams of `teams` the API serves `key` in, with the role `GET /v1/team` names."""
    answers = {team: call(server, key, "GET", "/v1/team", team) for team in teams}
    return {team: answer.json()["role"] for team, answer in answers.items() if answer.status_code == 200}


def test_the_api_and_the_dashboard_apply_one_policy(server, cast):
    """auth/policy.py asked the same questions through the API and through the dashboard: the teams a key
    reaches and its role in each are the same on both, before and after a block, and a member who may not
    manage the team's keys gets the same refusal from the team API and from the keys page and its forms."""
    team_c = admin(server, "POST", "/admin/teams", name=f"C-{cast.team_a[-8:]}")["id"]  # none of the cast's
    teams = [cast.team_a, cast.team_b, team_c]
    sam, service = cast.sam_key["key"], cast.b_service["key"]
    expected = {sam: {cast.team_a: "member", cast.team_b: "owner"}, service: {cast.team_b: "service"},
                ADMIN_KEY: dict.fromkeys(teams, "admin")}
    for key, roles in expected.items():
        assert _api_roles(server, key, teams) == roles
        with sign_in(server.url, key) as client:
            shown = _switcher(client.get("/dashboard/overview").text)
            assert {team: role for team, role in shown.items() if team in teams} == roles
    refused = call(server, sam, "GET", "/v1/team/keys", cast.team_a)
    assert refused.status_code == 403
    message = refused.json()["error"]["message"]
    with sign_in(server.url, sam) as client:
        page = client.get("/dashboard/keys", params={"team_id": cast.team_a})
        assert page.status_code == 403 and message in html.unescape(page.text)
        csrf = csrf_of(client.get("/dashboard/overview", params={"team_id": cast.team_a}).text)
        form = client.post("/dashboard/keys/create", params={"team_id": cast.team_a}, data={"csrf": csrf, "name": "x"})
        assert form.status_code == 403 and message in html.unescape(form.text)
        assert call(server, sam, "POST", "/v1/team/keys", cast.team_a, name="x").json()["error"]["message"] == message
        # a block by A's owner takes A from Sam's key on both at once, and leaves B
        assert call(server, cast.ann_key, "POST", f"/v1/team/keys/{cast.sam_key['id']}/block").status_code == 200
        assert _api_roles(server, sam, teams) == {cast.team_b: "owner"}
        shown = _switcher(client.get("/dashboard/overview", params={"team_id": cast.team_b}).text)
        assert {team: role for team, role in shown.items() if team in teams} == {cast.team_b: "owner"}


def test_a_shared_members_key_shows_the_owner_of_a_nothing_of_b(server, cast):
    """Sam's personal key made in B carries B's budget (a Slack-style webhook, B's e-mails) and is used in B; A's
    owner lists it (Sam is A's member too) and learns none of it."""
    made_in_b = admin(server, "POST", "/admin/keys", name="sam-in-b", team_id=cast.team_b, user_id=cast.sam,
                      models=[MODEL], limits={"spend_budget": {"amount_micros": 10**6, "webhook_url": HOOK,
                                                               "emails": ["cfo@b-corp.example"]}})
    assert acts_in(server, made_in_b["key"], cast.team_b)
    listing = call(server, cast.ann_key, "GET", "/v1/team/keys")
    assert listing.status_code == 200
    shown = {k["id"]: k for k in listing.json()["data"]}[made_in_b["id"]]
    assert shown["made_here"] is False and shown["user_id"] == cast.sam and shown["blocked"] is False
    assert shown["team_id"] is None and shown["limits"] is None and shown["models"] == []
    assert shown["last_used_at"] is None
    for secret in (HOOK, "b-teams-webhook-secret", "cfo@b-corp.example", cast.team_b):
        assert secret not in listing.text
    with sign_in(server.url, cast.ann_key) as ann:  # nor does A's owner's keys page
        page = ann.get("/dashboard/keys")
        assert page.status_code == 200 and made_in_b["id"] in page.text
        row = re.search(rf'<tr data-key-id="{made_in_b["id"]}">.*?</tr>', page.text, re.S).group(0)
        assert "made in another team" in row and "$1.00" not in row
        for secret in (HOOK, "cfo@b-corp.example", cast.team_b):
            assert secret not in page.text
    # B's own owners see their key whole
    theirs = {k["id"]: k for k in call(server, cast.bea_key, "GET", "/v1/team/keys").json()["data"]}
    assert theirs[made_in_b["id"]]["limits"]["spend_budget"]["webhook_url"] == HOOK
    # the block A's owner may still place answers in A's terms
    blocked = call(server, cast.ann_key, "POST", f"/v1/team/keys/{made_in_b['id']}/block")
    assert blocked.status_code == 200 and HOOK not in blocked.text and cast.team_b not in blocked.text


def test_members_see_that_alerts_exist_not_where_they_go(server, cast):
    admin(server, "PATCH", f"/admin/teams/{cast.team_b}",
          limits={"spend_budget": {"amount_micros": 10**6, "webhook_url": HOOK, "emails": ["cfo@b-corp.example"]}})
    member = admin(server, "POST", "/admin/users", name=f"mo-{cast.team_b[-8:]}")["id"]
    admin(server, "PUT", f"/admin/teams/{cast.team_b}/members/{member}", role="member")
    member_key = admin(server, "POST", "/admin/keys", name="mo", team_id=cast.team_b, user_id=member)["key"]
    for key in (member_key, cast.b_service["key"]):  # a member, a service key
        view = call(server, key, "GET", "/v1/team")
        assert view.status_code == 200, view.text
        assert HOOK not in view.text and "cfo@b-corp.example" not in view.text
        body = view.json()
        assert body["alerts_to_webhook"] is True and body["alerts_to_emails"] == 1
        assert body["limits"]["spend_budget"]["amount_micros"] == 10**6
    owner_view = call(server, cast.bea_key, "GET", "/v1/team").json()
    assert owner_view["limits"]["spend_budget"]["webhook_url"] == HOOK


def test_members_see_no_destination_of_the_teams_health_alerts(server, cast):
    # the same secret on the team's other alerts (PUT /v1/team/alerts): its webhook and e-mails are the owners'
    health_hook = HOOK.replace("b-teams-webhook-secret", "b-teams-health-secret")
    admin(server, "PATCH", f"/admin/teams/{cast.team_b}", limits={
        "spend_budget": {"amount_micros": 10**6},
        "health_alerts": {"error_rate_percent": 30, "webhook_url": health_hook, "emails": ["sre@b-corp.example"]}})
    member = admin(server, "POST", "/admin/users", name=f"hm-{cast.team_b[-8:]}")["id"]
    admin(server, "PUT", f"/admin/teams/{cast.team_b}/members/{member}", role="member")
    member_key = admin(server, "POST", "/admin/keys", name="hm", team_id=cast.team_b, user_id=member)["key"]
    for key in (member_key, cast.b_service["key"]):
        view = call(server, key, "GET", "/v1/team")
        assert view.status_code == 200, view.text
        assert "b-teams-health-secret" not in view.text and "sre@b-corp.example" not in view.text, view.text
        assert view.json()["limits"]["health_alerts"]["error_rate_percent"] == 30  # that they exist is no secret
    owner_view = call(server, cast.bea_key, "GET", "/v1/team").json()
    assert owner_view["limits"]["health_alerts"]["webhook_url"] == health_hook
    assert owner_view["limits"]["health_alerts"]["emails"] == ["sre@b-corp.example"]


def test_the_default_teams_owners_see_no_admin_key_names(server, cast):
    default = next(t["id"] for t in admin(server, "GET", "/admin/teams?limit=1000")["data"] if t["name"] == "default")
    root = admin(server, "POST", "/admin/keys", name="root-ops-zebra", team_id=default, is_admin=True)
    made = httpx.post(f"{server.url}/admin/keys", json={"name": "by-root", "team_id": default}, timeout=30,
                      headers={"authorization": f"Bearer {root['key']}"})
    assert made.status_code == 201, made.text  # the admin key acts: an entry in the default team's log
    owner = admin(server, "POST", "/admin/users", name=f"dora-{cast.team_a[-8:]}")["id"]
    admin(server, "PUT", f"/admin/teams/{default}/members/{owner}", role="owner")
    dora = admin(server, "POST", "/admin/keys", name="dora", team_id=default, user_id=owner)["key"]
    with sign_in(server.url, dora) as client:
        page = client.get("/dashboard/audit", params={"team_id": default})
        assert page.status_code == 200, page.text[:300]
        assert "by-root" in page.text  # the entry is there ...
        assert "root-ops-zebra" not in page.text  # ... by "operator", not by the admin key's name
    assert all(not k["is_admin"] for k in call(server, dora, "GET", "/v1/team/keys", default).json()["data"])


def test_an_owner_makes_at_most_max_keys_per_team_live_keys(server, cast):
    made = []
    while True:
        answer = call(server, cast.bea_key, "POST", "/v1/team/keys", name=f"bulk-{len(made)}")
        if answer.status_code != 201:
            break
        made.append(answer.json()["id"])
        assert len(made) <= MAX_KEYS
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "too_many_keys", answer.text
    # the limit counts live keys made in B: B's service key, Bea's own, and what she made
    assert len(made) == MAX_KEYS - 2
    assert call(server, cast.bea_key, "DELETE", f"/v1/team/keys/{made[0]}").status_code == 200
    assert call(server, cast.bea_key, "POST", "/v1/team/keys", name="after-revoke").status_code == 201
    assert call(server, cast.bea_key, "POST", "/v1/team/keys", name="over").status_code == 409
    # the operator is not capped
    assert admin(server, "POST", "/admin/keys", name="by-operator", team_id=cast.team_b)["id"]


def test_a_keys_model_list_is_bounded_when_made_as_when_edited(server, cast):
    # what an owner makes us store is bounded: 32 models of 200 characters, on create as on edit (a create
    # took any list the 4 MiB body held, times max_keys_per_team, and revoked keys stay on record)
    for models in (["m" * 200] * 33, [f"{index}-{'m' * 190}" for index in range(5000)]):
        answer = call(server, cast.ann_key, "POST", "/v1/team/keys", name="listed", models=models)
        assert answer.status_code == 400, answer.text[:300]
        assert "models" in answer.json()["error"]["message"], answer.text[:300]
    assert not any(k["name"] == "listed" for k in call(server, cast.ann_key, "GET", "/v1/team/keys?limit=1000")
                   .json()["data"])
    made = call(server, cast.ann_key, "POST", "/v1/team/keys", name="listed", models=[MODEL] + ["n" * 200] * 31)
    assert made.status_code == 201, made.text


def test_the_team_keys_listing_is_paged(server, cast):
    for index in range(5):
        assert call(server, cast.ann_key, "POST", "/v1/team/keys", name=f"page-{index}").status_code == 201
    whole = listed_ids(server, cast.ann_key)
    seen, cursor = [], None
    while True:
        answer = httpx.get(f"{server.url}/v1/team/keys", params={"limit": 2, **({"cursor": cursor} if cursor else {})},
                           headers={"authorization": f"Bearer {cast.ann_key}"}, timeout=30)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert len(page["data"]) <= 2
        seen += [k["id"] for k in page["data"]]
        if not page["has_more"]:
            break
        cursor = page["next_cursor"]
    assert seen == list(whole) and len(seen) >= 7
    for bad in ({"limit": "0"}, {"limit": "1001"}, {"cursor": "not-a-cursor"}):
        refused = httpx.get(f"{server.url}/v1/team/keys", params=bad, timeout=30,
                            headers={"authorization": f"Bearer {cast.ann_key}"})
        assert refused.status_code == 400, (bad, refused.text)
