"""A missed client deadline (the worker's `timeout` error) is a 408 with `x-should-retry: false` in every
dialect, before the first token and mid-stream, never a 429 nor a stream that ends as if it succeeded."""

from __future__ import annotations

import json

import openai
import pytest

from common.protocol import Error
from testkit.protocol_worker import MODEL, Reply, tokens
from tests.gateway.generation_bodies import BODIES, body

TIMEOUT = Error(kind="timeout", message="the request's deadline passed before it finished")


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("stream", [False, True])
async def test_a_deadline_missed_before_any_token_is_408_not_retried(gateway_app, worker, path, stream):
    worker.replies = [Reply([TIMEOUT])]  # inside a 200 stream, as the engine reports a request it never started
    response = await gateway_app.post(path, json=body(path, stream), headers=gateway_app.key_headers)
    assert response.status_code == 408, (path, response.status_code, response.text)
    assert response.headers["x-should-retry"] == "false"
    assert "deadline" in response.text
    assert len(worker.requests) == 1  # not retried on another replica either


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate", "/generate_stream"])
async def test_a_deadline_missed_mid_stream_ends_the_stream_with_an_error(gateway_app, worker, path):
    worker.replies = [Reply([*tokens("one two three")[:3], TIMEOUT])]
    response = await gateway_app.post(path, json=body(path, stream=True), headers=gateway_app.key_headers)
    assert response.status_code == 200  # the tokens already went out
    payloads = [line.split(":", 1)[1].strip() for line in response.text.splitlines() if line.startswith("data:")]
    errors = [json.loads(p) for p in payloads if p != "[DONE]" and "error" in json.loads(p)]
    assert errors and "deadline" in json.dumps(errors[-1]), response.text
    assert "one" in response.text


async def test_the_openai_sdk_raises_on_a_deadline_missed_mid_stream(gateway_app, worker):
    worker.replies = [Reply([*tokens("one two three")[:3], TIMEOUT])]
    client = openai.AsyncOpenAI(base_url=f"{gateway_app.base_url}/v1", api_key="unused", http_client=gateway_app,
                                default_headers=gateway_app.key_headers, max_retries=0)
    stream = await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                  stream=True)
    seen = []
    with pytest.raises(openai.APIError, match="deadline"):
        async for chunk in stream:
            seen.append(chunk.choices[0].delta.content if chunk.choices else None)
    assert "one" in seen
