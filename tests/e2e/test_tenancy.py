"""One tenant cannot hurt another, through the real `sluice serve` (gateway + real worker + SmolLM2):
the cached `/health_generate` probe, limits and allow-lists on the tokenizer routes, `/v1/models` filtered
by the allow-list, `/v1/usage` isolated by team, the default team's configured limits, and the failed-auth
throttle keyed by the real client (`X-Forwarded-For` only from `trusted_proxies`).

Requests leave from 127.0.0.1 (an untrusted peer) or 127.0.0.2 (the trusted proxy of the config): Linux
routes all of 127/8 to the loopback interface, so the gateway sees two distinct peers.
"""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from testkit.admin import admin
from testkit.sluice import MODEL, running_sluice

pytestmark = pytest.mark.slow
ADMIN_KEY = "tenancy-test-admin-key-0123456789abcdef"
PROXY = "127.0.0.2"
OWN_ADDRESS = "127.0.0.4"  # a client no other test makes fail (the throttle tests throttle 127.0.0.5)
SPOOFER = "127.0.0.5"  # an untrusted peer only the throttle test uses, so it alone counts that address's refusals
REJECTIONS = 60  # the default rejections_per_minute: the failed-auth budget of a client
BAD_KEY = "sk-sluice-000000000000-" + "a" * 32
DEFAULT_LIMITS = {"rpm": 1000, "tpm": 500_000, "max_concurrency": 16}
CONFIG = f"""
health_generate_interval_s = 3600
trusted_proxies = ["{PROXY}/32"]
[default_team_limits]
rpm = {DEFAULT_LIMITS["rpm"]}
tpm = {DEFAULT_LIMITS["tpm"]}
max_concurrency = {DEFAULT_LIMITS["max_concurrency"]}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_sluice(tmp_path_factory.mktemp("tenancy"), config=CONFIG,
                        env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as running:
        yield running


def team_key(server, name: str, limits: dict | None = None, **key) -> tuple[str, str]:
    """A new team (with `limits`) and a service key of it: (team id, clear key)."""
    team = admin(server, "POST", "/admin/teams", name=name, limits=limits)
    return team["id"], admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team["id"], **key)["key"]


def bearer(key: str, **headers: str) -> dict:
    return {"authorization": f"Bearer {key}", **headers}


def probes(server) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=bearer(ADMIN_KEY), timeout=10).text
    found = re.search(r'^sluice_health_generate_probes_total\{outcome="ok"\} (\S+)$', text, re.MULTILINE)
    assert found, "no health_generate probe counted"
    return float(found.group(1))


def test_health_generate_runs_one_generation_per_interval_for_any_number_of_callers(server):
    async def many(count: int) -> list[int]:
        async with httpx.AsyncClient(timeout=120) as client:
            replies = await asyncio.gather(*(client.get(f"{server.url}/health_generate") for _ in range(count)))
        return [reply.status_code for reply in replies]

    assert set(asyncio.run(many(24))) == {200}  # concurrent callers share the one probe in flight
    assert probes(server) == 1
    assert set(asyncio.run(many(24))) == {200}  # later callers within the interval get its answer
    assert probes(server) == 1


TOKENIZER_CALLS = (("/tokenize", {"inputs": "Hello world"}),  # TGI
                   ("/tokenize", {"text": "Hello world"}),  # SGLang
                   ("/detokenize", {"tokens": [1, 2, 3]}))  # SGLang


def test_tokenizer_routes_count_against_the_keys_request_rate(server):
    _, key = team_key(server, "tokenizer-rpm", limits={"rpm": len(TOKENIZER_CALLS)})
    for path, body in TOKENIZER_CALLS:
        assert httpx.post(f"{server.url}{path}", json=body, headers=bearer(key), timeout=30).status_code == 200
    for path, body in TOKENIZER_CALLS:
        refused = httpx.post(f"{server.url}{path}", json=body, headers=bearer(key), timeout=30)
        assert refused.status_code == 429, (path, body, refused.text)
        assert int(refused.headers["retry-after"]) >= 1


def test_tokenizer_routes_check_the_keys_model_allow_list(server):
    _, key = team_key(server, "tokenizer-models", models=["some-other-model"])
    for path, body in TOKENIZER_CALLS:
        for sent in (body, {**body, "model": MODEL}):
            refused = httpx.post(f"{server.url}{path}", json=sent, headers=bearer(key), timeout=30)
            assert refused.status_code == 403, (path, sent, refused.text)
            assert "may not use model" in refused.text
    _, allowed = team_key(server, "tokenizer-allowed", models=[MODEL])
    for path, body in TOKENIZER_CALLS:
        assert httpx.post(f"{server.url}{path}", json=body, headers=bearer(allowed), timeout=30).status_code == 200


def test_models_lists_only_what_the_key_may_call(server):
    def listed(key: str) -> list[str]:
        reply = httpx.get(f"{server.url}/v1/models", headers=bearer(key), timeout=10)
        assert reply.status_code == 200, reply.text
        return [model["id"] for model in reply.json()["data"]]

    assert listed(team_key(server, "models-none", models=["some-other-model"])[1]) == []
    assert listed(team_key(server, "models-one", models=[MODEL])[1]) == [MODEL]
    assert listed(team_key(server, "models-all")[1]) == [MODEL]  # no allow-list: every model


def test_usage_is_isolated_by_team_whatever_the_team_header_says(server):
    teams = {name: team_key(server, f"usage-{name}") for name in ("a", "b")}
    for name, (_, key) in teams.items():
        for _ in range(1 if name == "a" else 2):
            reply = httpx.post(f"{server.url}/v1/completions", headers=bearer(key), timeout=120,
                               json={"model": MODEL, "prompt": "Hi", "max_tokens": 2})
            assert reply.status_code == 200, reply.text
    (a_id, a_key), (b_id, b_key) = teams["a"], teams["b"]

    def usage(key: str, **headers: str) -> httpx.Response:
        return httpx.get(f"{server.url}/v1/usage", params={"group_by": "key"}, headers=bearer(key, **headers),
                         timeout=30)

    deadline = time.monotonic() + 60  # the ledger ships its records to the database in the background
    while usage(b_key).json()["totals"]["requests"] < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    own = usage(a_key).json()
    assert own["team_id"] == a_id and own["totals"]["requests"] == 1 and len(own["rows"]) == 1
    assert usage(a_key, **{"x-team-id": a_id}).json()["totals"]["requests"] == 1
    for header in ("x-team-id", "x-friendli-team"):
        refused = usage(a_key, **{header: b_id})
        assert refused.status_code == 403, refused.text
        assert "may not use team" in refused.text
    assert usage(b_key).json()["totals"]["requests"] == 2
    # the operator's admin key may read any team by the header
    assert usage(ADMIN_KEY, **{"x-team-id": b_id}).json()["totals"]["requests"] == 2


def test_a_new_deployments_default_team_has_the_configured_limits(server):
    default = next(team for team in admin(server, "GET", "/admin/teams")["data"] if team["name"] == "default")
    assert default["limits"] == DEFAULT_LIMITS


def _client(local_address: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=local_address), timeout=30)


def test_forwarded_for_from_an_untrusted_peer_does_not_escape_the_throttle(server):
    with _client(SPOOFER) as client:
        for attempt in range(REJECTIONS):  # a new "client" each time, as far as the header goes
            spoofed = {"x-forwarded-for": f"198.51.100.{attempt}"}
            assert client.get(f"{server.url}/v1/models", headers=bearer(BAD_KEY, **spoofed)).status_code == 401
        throttled = client.get(f"{server.url}/v1/models", headers=bearer(BAD_KEY, **{"x-forwarded-for": "1.2.3.4"}))
        assert throttled.status_code == 429 and int(throttled.headers["retry-after"]) >= 1
        # a valid key from the throttled address is still served
        assert client.get(f"{server.url}/v1/models", headers=bearer(server.api_key)).status_code == 200


def test_throttle_is_keyed_by_the_client_a_trusted_proxy_names(server):
    def attempt(client: httpx.Client, forwarded_for: str, key: str = BAD_KEY) -> int:
        headers = bearer(key, **{"x-forwarded-for": forwarded_for})
        return client.get(f"{server.url}/v1/models", headers=headers).status_code

    with _client(PROXY) as proxy:
        assert [attempt(proxy, "203.0.113.5") for _ in range(REJECTIONS)] == [401] * REJECTIONS
        assert attempt(proxy, "203.0.113.5") == 429
        # the client's own (leftmost) entries are not trusted: the rightmost untrusted hop is the client
        assert attempt(proxy, "6.6.6.6, 203.0.113.5") == 429
        # other customers behind the same proxy are not locked out, whether their key is bad or good
        assert attempt(proxy, "203.0.113.6") == 401
        assert attempt(proxy, "203.0.113.6", server.api_key) == 200
        # nor is the throttled client's own valid key
        assert attempt(proxy, "203.0.113.5", server.api_key) == 200


def test_roles_members_use_the_api_and_owners_also_manage_the_teams_keys(server):
    team = admin(server, "POST", "/admin/teams", name="roles")["id"]
    other_team, other_key = team_key(server, "roles-other")
    users = {role: admin(server, "POST", "/admin/users", name=f"roles-{role}")["id"] for role in ("owner", "member")}
    keys = {}
    for role, user in users.items():
        admin(server, "PUT", f"/admin/teams/{team}/members/{user}", role=role)
        keys[role] = admin(server, "POST", "/admin/keys", name=f"{role}-key", team_id=team, user_id=user)
    service = admin(server, "POST", "/admin/keys", name="service-key", team_id=team)
    owner, member = bearer(keys["owner"]["key"]), bearer(keys["member"]["key"])

    def call(method: str, path: str, headers: dict, **body) -> httpx.Response:
        with _client(OWN_ADDRESS) as client:  # a revoked key's 401 is not the throttle's 429 for 127.0.0.1
            return client.request(method, f"{server.url}{path}", headers=headers, json=body or None)

    # every key of the team uses the API, reads its usage and sees its team and role
    for role, headers in (("owner", owner), ("member", member), ("service", bearer(service["key"]))):
        assert call("GET", "/v1/usage", headers).status_code == 200
        assert call("GET", "/v1/team", headers).json() == {"id": team, "limits": None, "role": role,
                                                           "alerts_to_webhook": False, "alerts_to_emails": 0}
    # members and service keys manage nothing
    for headers in (member, bearer(service["key"])):
        for method, path, body in (("GET", "/v1/team/keys", {}), ("GET", "/v1/team/members", {}),
                                   ("POST", "/v1/team/keys", {"name": "x"}),
                                   ("DELETE", f"/v1/team/keys/{service['id']}", {}),
                                   ("POST", f"/v1/team/keys/{service['id']}/rotate", {})):
            assert call(method, path, headers, **body).status_code == 403, (method, path)
        assert call("GET", "/admin/keys", headers).status_code == 403
    assert call("GET", "/admin/keys", owner).status_code == 403  # owners are not operators

    # owners: the team's members and keys (never another team's, never an admin key)
    assert {m["user_id"] for m in call("GET", "/v1/team/members", owner).json()["data"]} == set(users.values())
    listed = {k["id"] for k in call("GET", "/v1/team/keys", owner).json()["data"]}
    assert listed == {keys["owner"]["id"], keys["member"]["id"], service["id"]}
    created = call("POST", "/v1/team/keys", owner, name="ci", models=[MODEL])
    assert created.status_code == 201 and created.json()["team_id"] == team and not created.json()["is_admin"]
    assert call("GET", "/v1/models", bearer(created.json()["key"])).status_code == 200
    # a personal key acts in all its user's teams: only the operator makes one (tests/security/test_tenant_keys.py)
    assert call("POST", "/v1/team/keys", owner, name="for-member", user_id=users["member"]).status_code == 403
    refused = call("POST", "/v1/team/keys", owner, name="escalate", is_admin=True)
    assert refused.status_code == 400 and "is_admin" in refused.text
    assert call("POST", "/v1/team/keys", owner, name="x", team_id=other_team).status_code == 400

    rotated = call("POST", f"/v1/team/keys/{service['id']}/rotate", owner)
    assert rotated.status_code == 201 and rotated.json()["replaces"] == service["id"]
    # a member's personal key is not the owner's to revoke or rotate: they block it in this team
    assert call("DELETE", f"/v1/team/keys/{keys['member']['id']}", owner).status_code == 403
    assert call("POST", f"/v1/team/keys/{keys['member']['id']}/block", owner).status_code == 200
    assert call("GET", "/v1/models", member).status_code == 403  # blocked in the team by the owner
    other_key_id = next(k["id"] for k in admin(server, "GET", f"/admin/keys?team_id={other_team}")["data"])
    admin_key_id = next(k["id"] for k in admin(server, "GET", "/admin/keys")["data"] if k["is_admin"])
    for foreign in (other_key_id, admin_key_id, "no-such-key"):
        assert call("DELETE", f"/v1/team/keys/{foreign}", owner).status_code == 404
        assert call("POST", f"/v1/team/keys/{foreign}/rotate", owner).status_code == 404
    assert call("GET", "/v1/models", bearer(other_key)).status_code == 200

    # a role is per team: the owner of one team is a member (or nothing) in another
    member_team = admin(server, "POST", "/admin/teams", name="roles-second")["id"]
    admin(server, "PUT", f"/admin/teams/{member_team}/members/{users['owner']}", role="member")
    as_member = bearer(keys["owner"]["key"], **{"x-team-id": member_team})
    assert call("GET", "/v1/team", as_member).json()["role"] == "member"
    assert call("GET", "/v1/team/keys", as_member).status_code == 403
    assert call("GET", "/v1/team/keys", bearer(keys["owner"]["key"], **{"x-team-id": other_team})).status_code == 403
    # an admin key manages the team it names
    assert call("GET", "/v1/team/keys", bearer(ADMIN_KEY, **{"x-team-id": team})).status_code == 200
