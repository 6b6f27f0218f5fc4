"""A choice the worker ended by failing (its grammar refused the model's token) is never reported as a normal
finish: SGLang says `abort`, as SGLang does; every other dialect, whose finish vocabulary has no such word (and
whose strict SDKs refuse unknown ones), fails the request: a 502 in its envelope, or its stream's error event."""

from __future__ import annotations

import json

import openai
import pytest

from testkit.protocol_worker import MODEL, Reply, tokens
from tests.gateway.generation_bodies import BODIES, STREAM_ONLY, body

FAILED = tokens('{"a": ', reason="error", incomplete=True)
NOT_SGLANG = [path for path in BODIES if path != "/generate"]


@pytest.mark.parametrize("path", [p for p in NOT_SGLANG if p not in STREAM_ONLY])
async def test_a_failed_choice_fails_the_request(gateway_app, worker, path):
    worker.replies = [Reply(FAILED)]
    response = await gateway_app.post(path, json=body(path), headers=gateway_app.key_headers)
    assert response.status_code == 502, response.text
    assert "grammar refused" in response.text and '"stop"' not in response.text


@pytest.mark.parametrize("path", [p for p in NOT_SGLANG if p != "/v1/completions/generate"])
async def test_a_failed_choice_ends_the_stream_with_an_error(gateway_app, worker, path):
    worker.replies = [Reply(FAILED)]
    response = await gateway_app.post(path, json=body(path, stream=True), headers=gateway_app.key_headers)
    assert response.status_code == 200  # its tokens went out first
    assert "grammar refused" in response.text
    assert '"finish_reason":"stop"' not in response.text and '"finish_reason":"length"' not in response.text


@pytest.mark.parametrize("stream", [False, True])
async def test_sglang_reports_a_failed_choice_as_abort(gateway_app, worker, stream):
    worker.replies = [Reply(FAILED)]
    response = await gateway_app.post("/generate", json=body("/generate", stream), headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text
    last = response.json() if not stream else json.loads(
        [line for line in response.text.splitlines() if line.startswith("data: {")][-1][6:])
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert "grammar" in last["meta_info"]["finish_reason"]["message"]
    assert last["meta_info"]["incomplete"] is True


@pytest.mark.parametrize(("reason", "openai_word", "tgi_word"), [
    ("length", "length", "length"), ("eos_token", "stop", "eos_token"), ("stop_sequence", "stop", "stop_sequence")])
async def test_a_normal_finish_keeps_its_word(gateway_app, worker, reason, openai_word, tgi_word):
    worker.replies = [Reply(tokens("fine", reason=reason))]
    completion = await gateway_app.post("/v1/completions", json=body("/v1/completions"),
                                        headers=gateway_app.key_headers)
    assert completion.json()["choices"][0]["finish_reason"] == openai_word
    tgi = await gateway_app.post("/v1/completions/generate", json=body("/v1/completions/generate",
                                                                     parameters={"details": True}),
                             headers=gateway_app.key_headers)
    assert tgi.json()["details"]["finish_reason"] == tgi_word


async def test_the_openai_sdk_raises_instead_of_reading_stop(gateway_app, worker):
    worker.replies = [Reply(FAILED)]
    client = openai.AsyncOpenAI(base_url=f"{gateway_app.base_url}/v1", api_key="unused", http_client=gateway_app,
                                default_headers=gateway_app.key_headers, max_retries=0)
    with pytest.raises(openai.APIStatusError) as info:
        await client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "{}"}],
                                             response_format={"type": "json_object"})
    assert info.value.status_code == 502 and "grammar" in info.value.message
