"""A spent hard budget in money, as the real SDKs meet it through the real `sluice serve`, each in its service's own
answer to exhausted credit and never retried (one request on the wire with retries on): openai-python gets a
RateLimitError whose code is `insufficient_quota`, from chat completions and from the Responses API alike;
anthropic's SDK a PaymentRequiredError, Anthropic's 402 `billing_error`; huggingface_hub's InferenceClient on a
TGI route its HTTP error of status 402, as Hugging Face's hosted inference answers, not an OverloadedError. (A rate
limit keeps Retry-After, which the SDKs obey: tests/gateway/test_spend_budgets.py.)"""

from __future__ import annotations

import contextlib

import anthropic
import httpx
import httpx2
import huggingface_hub
import openai
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError, OverloadedError
from huggingface_hub.utils._http import default_client_factory

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
    """Small requests ($5 each, their bound of about $20 reserved) until the $40 budget has no room for one."""
    headers = {"authorization": f"Bearer {key}"}
    for _ in range(20):
        done = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
                          headers=headers)
        if done.status_code != 200:
            assert done.json()["error"]["code"] == "insufficient_quota", done.text
            return
    raise AssertionError("the budget never ran out")


def test_openai_sdk_does_not_retry_an_exhausted_quota(served):
    key = new_key(served, "openai-quota", {"spend_budget": {"amount_micros": 40_000_000}})
    spend_it(served, key)
    sent: list[str] = []
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=3, http_client=counting_client(sent))
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert refused.value.code == "insufficient_quota" and refused.value.type == "insufficient_quota"
    assert sent == ["/v1/chat/completions"]  # no retry


def test_openai_sdk_does_not_retry_an_exhausted_quota_of_the_responses_api(served):
    key = new_key(served, "responses-quota", {"spend_budget": {"amount_micros": 40_000_000}})
    spend_it(served, key)
    sent: list[str] = []
    client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=key, max_retries=3, http_client=counting_client(sent))
    for stream in (False, True):
        with pytest.raises(openai.RateLimitError) as refused:
            client.responses.create(model=MODEL, input="Hi", max_output_tokens=16, stream=stream)
        assert refused.value.code == "insufficient_quota" and refused.value.type == "insufficient_quota"
        assert refused.value.response.headers["x-should-retry"] == "false"
    assert sent == ["/v1/responses"] * 2  # one each, no retry


def test_anthropic_sdk_gets_its_billing_error_and_does_not_retry_it(served):
    key = new_key(served, "anthropic-quota", {"spend_budget": {"amount_micros": 40_000_000}})
    spend_it(served, key)
    sent: list[str] = []
    client = anthropic.Anthropic(base_url=served.url, api_key=key, max_retries=3,
                                 http_client=counting_client(sent, httpx2))
    for stream in (False, True):
        with pytest.raises(anthropic.PaymentRequiredError) as refused:
            client.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "Hi"}],
                                   stream=stream)
        assert refused.value.status_code == 402 and refused.value.type == "billing_error"
        assert refused.value.body == {"type": "error", "error": {"type": "billing_error",
                                                                "message": refused.value.api_message}}
        assert "budget" in refused.value.api_message and "retry-after" not in refused.value.response.headers
    assert sent == ["/v1/messages"] * 2  # one each, no retry


@contextlib.contextmanager
def hub_requests_counted(sent: list, server):
    """huggingface_hub's shared HTTP client, noting every request it sends to `server` (not its own calls to the
    Hub), for the block only."""
    def note(request) -> None:
        if str(request.url).startswith(server.url):
            sent.append(request.url.path)

    huggingface_hub.set_client_factory(lambda: httpx2.Client(event_hooks={"request": [note]}))
    try:
        yield
    finally:
        huggingface_hub.set_client_factory(default_client_factory)


def test_huggingface_hub_gets_a_402_on_a_tgi_route_and_does_not_retry_it(served):
    key = new_key(served, "tgi-quota", {"spend_budget": {"amount_micros": 40_000_000}})
    spend_it(served, key)
    sent: list[str] = []
    with hub_requests_counted(sent, served), pytest.raises(HfHubHTTPError) as refused:
        InferenceClient(base_url=served.url, api_key=key).text_generation("Hi", max_new_tokens=4)
    assert not isinstance(refused.value, OverloadedError)
    assert refused.value.response.status_code == 402
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert "error_type" not in refused.value.response.json()
    assert sent == ["/"]
