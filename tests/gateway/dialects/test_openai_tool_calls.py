"""Tool calls on OpenAI's chat route as OpenAI, vLLM and TGI return them (issue #34): a forced named tool is
called once unless `parallel_tool_calls` is true (a framework runs every call it gets, and each is billed), and a
call cut by `max_tokens` comes back as it stands with `finish_reason: "length"` and no `incomplete` field, which
no OpenAI client knows. Through the real gateway app; the protocol worker plays the worker's side."""

from __future__ import annotations

import json

import pytest

from common.protocol import Accepted, Done, Finish, Token, ToolCall, ToolCallDelta
from testkit.protocol_worker import MODEL, Reply

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
FORCED = {"type": "function", "function": {"name": "get_weather"}}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER, TIME]}


@pytest.mark.parametrize(("choice", "parallel", "expected"), [
    (FORCED, None, False), ("get_weather", None, False), (FORCED, True, True), (FORCED, False, False),
    ("required", None, True), ("auto", None, True), ("auto", False, False)])
async def test_a_forced_tool_is_called_once_unless_parallel_calls_are_asked(gateway_app, worker, choice, parallel,
                                                                           expected):
    body = {**CHAT, "tool_choice": choice, **({} if parallel is None else {"parallel_tool_calls": parallel})}
    response = await gateway_app.post("/v1/chat/completions", json=body, headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text
    assert worker.requests[-1]["tools"]["parallel_calls"] is expected


def cut_call() -> list:
    """A forced call cut by max_tokens inside its arguments: the worker's events."""
    call = ToolCall(id="call_" + "0" * 24, name="get_weather", arguments='{"city": "Par')
    return [Accepted(prompt_tokens=3, prompt_ids=[1, 2, 3], seeds=[7]),
            Token(index=0, token_id=10, text=""),  # with tools a token carries content only: none here
            ToolCallDelta(index=0, call=0, id=call.id, name=call.name, arguments=call.arguments),
            Finish(index=0, reason="length", text="", token_ids=[10], seed=7, incomplete=True, tool_calls=[call]),
            Done(prompt_tokens=3, completion_tokens=1, compute_tokens=1)]


async def test_a_tool_call_cut_by_max_tokens_is_returned_as_it_stands(gateway_app, worker):
    worker.replies = [Reply(cut_call())]
    body = {**CHAT, "tool_choice": FORCED, "max_tokens": 1}
    response = await gateway_app.post("/v1/chat/completions", json=body, headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    assert choice["finish_reason"] == "length" and "incomplete" not in choice, choice
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Par'}
    streamed = await gateway_app.post("/v1/chat/completions", json={**body, "stream": True},
                                      headers=gateway_app.key_headers)
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    finishes = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert [f["finish_reason"] for f in finishes] == ["length"] and "incomplete" not in finishes[0], finishes
    pieces = [p for c in chunks if c["choices"] for p in c["choices"][0]["delta"].get("tool_calls", [])]
    assert pieces[0]["function"]["name"] == "get_weather"
    assert "".join(p["function"]["arguments"] for p in pieces) == '{"city": "Par'


async def test_a_cut_response_format_output_still_says_it_is_incomplete(gateway_app, worker):
    worker.replies = [Reply([Accepted(prompt_tokens=3, prompt_ids=[1, 2, 3], seeds=[7]),
                             Token(index=0, token_id=10, text='{"a'),
                             Finish(index=0, reason="length", text='{"a', token_ids=[10], seed=7, incomplete=True),
                             Done(prompt_tokens=3, completion_tokens=1, compute_tokens=1)])]
    body = {"model": MODEL, "messages": CHAT["messages"], "max_tokens": 1, "response_format": {"type": "json_object"}}
    response = await gateway_app.post("/v1/chat/completions", json=body, headers=gateway_app.key_headers)
    assert response.json()["choices"][0]["incomplete"] is True, response.text
