"""Prompt tokens the worker took from its prefix cache (`Done.cached_tokens`) reach the client: OpenAI's
`usage.prompt_tokens_details.cached_tokens` and the Responses dialect's `usage.input_tokens_details.cached_tokens`,
whole and streamed. Through the real gateway app; the protocol worker answers as the engine does for a prompt
whose first 48 tokens were cached (tests/worker/engine/test_prefix_cache.py)."""

from __future__ import annotations

import json

from common.protocol import Accepted, Done, Finish, Token
from testkit.protocol_worker import MODEL, Reply

CACHED = [Accepted(prompt_tokens=60, prompt_ids=list(range(60)), seeds=[1]),
          Token(index=0, token_id=5, text="Hi"),
          Finish(index=0, reason="length", text="Hi", token_ids=[5], seed=1),
          Done(prompt_tokens=60, completion_tokens=1, compute_tokens=1, cached_tokens=48)]
BODY = {"model": MODEL, "input": "Say hi", "max_output_tokens": 1}


async def test_responses_report_the_cached_prompt_tokens(gateway_app, worker):
    worker.replies = [Reply(CACHED)]
    response = await gateway_app.post("/v1/responses", json=BODY, headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["input_tokens"] == 60 and usage["input_tokens_details"] == {"cached_tokens": 48}


async def test_streamed_responses_report_them_too(gateway_app, worker):
    worker.replies = [Reply(CACHED)]
    response = await gateway_app.post("/v1/responses", json={**BODY, "stream": True}, headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    completed = [e for e in events if e.get("type") in ("response.completed", "response.incomplete")]
    assert completed and completed[0]["response"]["usage"]["input_tokens_details"] == {"cached_tokens": 48}


async def test_openai_chat_reports_them_as_prompt_tokens_details(gateway_app, worker):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 1}
    worker.replies = [Reply(CACHED), Reply(CACHED)]
    whole = await gateway_app.post("/v1/chat/completions", json=body, headers=gateway_app.key_headers)
    assert whole.status_code == 200, whole.text
    assert whole.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 48}
    streamed = await gateway_app.post("/v1/chat/completions", headers=gateway_app.key_headers,
                                  json={**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 48}
