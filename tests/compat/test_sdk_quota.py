"""A spent hard budget in money, as the real SDKs meet it through the real `sluice serve`: openai-python gets a
RateLimitError whose code is `insufficient_quota` and does not retry it (one request on the wire with
max_retries=3); anthropic's SDK does not retry it either. (A rate limit keeps Retry-After, which the SDKs
obey: tests/gateway/test_spend_budgets.py.)"""

from __future__ import annotations

import time

import anthropic
import httpx
import httpx2
import openai
import pytest

from testkit.protocol_worker import MODEL, sluice_on_protocol_worker

ADMIN_KEY = "sdk-quota-admin-key-0123456789abcdef"
PRICES = "[pricing.models.default]\ninput = 1000000000000\noutput = 1000000000000\n"  # $1 a token


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quota")
    (folder / "prices.toml").write_text(PRICES)
    with sluice_on_protocol_worker(folder / "data", ADMIN_KEY,
                                   settings=f'pricing_file = "{folder / "prices.toml"}"\n') as (server, _):
        yield server


def new_key(server, name: str, limits: dict) -> str:
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    team = httpx.post(f"{server.url}/admin/teams", json={"name": name, "limits": limits}, headers=admin).json()["id"]
    return httpx.post(f"{server.url}/admin/keys", json={"name": "sdk", "team_id": team}, headers=admin).json()["key"]


def counting_client(sent: list, http=httpx):
    """An HTTP client for an SDK (`http`: the httpx package the SDK is built on) that notes every request sent."""
    return http.Client(event_hooks={"request": [lambda request: sent.append(request.url.path)]})


def spend_it(server, key: str) -> None:
    """One request ($5) spends the $1 budget; waits until the team's limits show it spent."""
    headers = {"authorization": f"Bearer {key}"}
    done = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "Hi"}, headers=headers)
    assert done.status_code == 200, done.text
    for _ in range(200):
        if httpx.get(f"{server.url}/v1/team/limits", headers=headers).json()["budgets"][0]["spent_micros"] > 0:
            time.sleep(1.1)  # past the gateway's spend cache
            return
        time.sleep(0.05)
    raise AssertionError("the spend never showed")


def test_openai_sdk_does_not_retry_an_exhausted_quota(served):
    key = new_key(served, "openai-quota", {"spend_budget": {"amount_micros": 1_000_000}})
    spend_it(served, key)
    sent: list[str] = []
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=3, http_client=counting_client(sent))
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert refused.value.code == "insufficient_quota" and refused.value.type == "insufficient_quota"
    assert sent == ["/v1/chat/completions"]  # no retry


def test_anthropic_sdk_does_not_retry_an_exhausted_quota(served):
    key = new_key(served, "anthropic-quota", {"spend_budget": {"amount_micros": 1_000_000}})
    spend_it(served, key)
    sent: list[str] = []
    client = anthropic.Anthropic(base_url=served.url, api_key=key, max_retries=3,
                                 http_client=counting_client(sent, httpx2))
    with pytest.raises(anthropic.APIStatusError) as refused:
        client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert refused.value.status_code == 429 and "quota" in str(refused.value)
    assert sent == ["/v1/messages"]
