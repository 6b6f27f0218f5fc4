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

import httpx
import pytest

from tests.fixtures.sluice import MODEL, running_sluice

pytestmark = pytest.mark.slow
ADMIN_KEY = "tenancy-test-admin-key-0123456789abcdef"
PROXY = "127.0.0.2"
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


def admin(server, method: str, path: str, **body) -> dict:
    response = httpx.request(method, f"{server.url}{path}", json=body or None, timeout=30,
                             headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code < 300, response.text
    return response.json()


def team_key(server, name: str, limits: dict | None = None, **key) -> tuple[str, str]:
    """A new team (with `limits`) and a service key of it: (team id, clear key)."""
    team = admin(server, "POST", "/admin/teams", name=name, limits=limits)
    return team["id"], admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team["id"], **key)["key"]


def bearer(key: str, **headers: str) -> dict:
    return {"authorization": f"Bearer {key}", **headers}


def probes(server) -> float:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    found = re.search(r'^sluice_health_generate_probes_total\{outcome="ok"\} (\S+)$', text, re.M)
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
    with _client("127.0.0.1") as client:
        for attempt in range(10):  # a new "client" each time, as far as the header goes
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
        assert [attempt(proxy, "203.0.113.5") for _ in range(10)] == [401] * 10
        assert attempt(proxy, "203.0.113.5") == 429
        # the client's own (leftmost) entries are not trusted: the rightmost untrusted hop is the client
        assert attempt(proxy, "6.6.6.6, 203.0.113.5") == 429
        # other customers behind the same proxy are not locked out, whether their key is bad or good
        assert attempt(proxy, "203.0.113.6") == 401
        assert attempt(proxy, "203.0.113.6", server.api_key) == 200
        # nor is the throttled client's own valid key
        assert attempt(proxy, "203.0.113.5", server.api_key) == 200
