"""Every 429 and 503 says when to retry (Retry-After), in each dialect's envelope: a worker that is overloaded or
not ready, a rate limit, a usage store that is away, a health check before the model is ready."""

from __future__ import annotations

import sqlite3

import msgspec
import pytest

from billing.store.base import TABLE
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from testkit.protocol_worker import MODEL, Reply, tokens
from testkit.servers import free_port
from tests.gateway.app_client import app_client, new_key
from tests.gateway.generation_bodies import BODIES, body
from tests.gateway.route_table import envelope


def assert_retry_after(response, status: int) -> int:
    assert response.status_code == status, response.text
    seconds = int(response.headers["retry-after"])
    assert seconds >= 1
    return seconds


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
async def test_an_overloaded_worker_is_a_429_with_retry_after(gateway_app, worker, path, stream):
    worker.replies = [Reply.refused(429, "overloaded", "the queue is full")]
    response = await gateway_app.post(path, json=body(path, stream), headers=gateway_app.key_headers)
    assert_retry_after(response, 429)
    assert "queue is full" in response.text


@pytest.mark.parametrize("path", list(BODIES))
async def test_a_worker_that_is_not_ready_is_a_503_with_retry_after(gateway_settings, worker, path):
    worker.replies = [Reply.refused(503, "unavailable", "the model is still loading")]
    # the refusing replica sits out its ejection; the request waits for another only max_wait_seconds
    endpoint = msgspec.structs.replace(gateway_settings.models[0], max_wait_seconds=0.5)
    async with app_client(msgspec.structs.replace(gateway_settings, models=[endpoint])) as gateway_app:
        assert_retry_after(await gateway_app.post(path, json=body(path), headers=gateway_app.key_headers), 503)


async def test_a_rate_limited_key_gets_retry_after(gateway_app):
    headers = await new_key(gateway_app, limits={"rpm": 1})
    assert (await gateway_app.post("/generate", json=body("/generate"), headers=headers)).status_code == 200
    refused = await gateway_app.post("/generate", json=body("/generate"), headers=headers)
    assert_retry_after(refused, 429)


async def test_a_spent_budget_says_when_it_resets(gateway_app, worker):
    worker.replies = [Reply(tokens(" ".join(["w"] * 30)))]  # 33 tokens used of 60
    headers = await new_key(gateway_app, limits={"monthly_token_budget": 60})
    assert (await gateway_app.post("/generate", json=body("/generate", sampling_params={"max_new_tokens": 40}),
                               headers=headers)).status_code == 200
    refused = await gateway_app.post("/generate", json=body("/generate", sampling_params={"max_new_tokens": 20}),
                                 headers=headers)
    # a spent budget is exhausted quota, not a wait: no Retry-After (as OpenAI answers it), told not to retry,
    # and the message says when the month's budget resets
    assert refused.status_code == 429 and "exceeded your current quota" in refused.text, refused.text
    assert "retry-after" not in refused.headers and refused.headers["x-should-retry"] == "false"
    assert "resets at" in refused.json()["error"]["message"]


async def test_a_request_no_wait_can_admit_says_not_to_retry(gateway_app):
    headers = await new_key(gateway_app, limits={"tpm": 50})
    refused = await gateway_app.post("/v1/completions", json=body("/v1/completions", max_tokens=500), headers=headers)
    assert refused.status_code == 429, refused.text
    assert "retry-after" not in refused.headers and refused.headers["x-should-retry"] == "false"


async def test_the_usage_api_is_a_503_with_retry_after_when_its_store_is_away(gateway_app, tmp_path):
    assert (await gateway_app.get("/v1/usage", headers=gateway_app.key_headers)).status_code == 200
    with sqlite3.connect(tmp_path / "sluice.db") as db:  # the usage table goes away under the running ledger
        db.execute(f"ALTER TABLE {TABLE} RENAME TO gone")
    for path, headers in (("/v1/usage", gateway_app.key_headers), ("/admin/usage", gateway_app.admin_headers)):
        response = await gateway_app.get(path, headers=headers)
        assert_retry_after(response, 503)
        assert envelope(path, response.json())["kind"] == "service_unavailable"


async def test_the_usage_api_throttle_is_a_429_with_retry_after(gateway_app):
    bad = {"authorization": "Bearer sk-sluice-000000000000-" + "c" * 32}
    for _ in range(61):  # the default rejections_per_minute (60), then one more
        response = await gateway_app.get("/v1/usage", headers=bad)
    assert_retry_after(response, 429)
    assert envelope("/v1/usage", response.json())["kind"] == "rate_limit_exceeded"


async def test_no_ready_worker_is_a_503_with_retry_after_on_every_route(gateway_settings):
    # nothing listens there
    nobody = EndpointSpec(name=MODEL, provisioner=StaticProvisioning(urls=[f"http://127.0.0.1:{free_port()}"]))
    # the activator holds a request up to max_wait_seconds for a replica to become ready
    endpoint = msgspec.structs.replace(nobody, max_wait_seconds=0.5)
    async with app_client(msgspec.structs.replace(gateway_settings, models=[endpoint])) as client:
        for path in ("/health", "/v1/completions/health"):
            assert_retry_after(await client.get(path), 503)
        for path in BODIES:
            response = await client.post(path, json=body(path), headers=client.key_headers)
            assert_retry_after(response, 503)
            assert "no replica became ready" in response.text, path
