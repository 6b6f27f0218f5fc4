"""Anthropic's Messages API through the real `sluice serve`, called with the real `anthropic` SDK (issue #34):
create, stream (its event sequence, ping included), a tool round trip (tool_use out, tool_result back in),
count_tokens, `x-api-key` and bearer authentication, and the SDK's typed errors from Anthropic's envelope and
status codes. Usage lands in the ledger as dialect `anthropic`. The gateway serves the protocol worker
(testkit/protocol_worker.py), which plays the worker's side from a script: this is about the wire."""

from __future__ import annotations

import time

import anthropic
import httpx
import pytest

from common.protocol import Accepted, Done, Error, Finish, Token, ToolCall, ToolCallDelta
from testkit.admin import admin
from testkit.protocol_worker import MODEL, Reply, tokens

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
HELLO = [{"role": "user", "content": "Hello there"}]


@pytest.fixture
def client(server):
    return anthropic.Anthropic(base_url=server.url, api_key=server.api_key, max_retries=0)


def test_create_returns_a_message(client, worker):
    message = client.messages.create(model=MODEL, max_tokens=16, system="Be brief.", messages=HELLO,
                                     stop_sequences=["END"],  # this SDK release has no sampling arguments:
                                     extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 40})
    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert [block.type for block in message.content] == ["text"] and message.content[0].text == "Hi there"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert (message.usage.input_tokens, message.usage.output_tokens) == (3, 2)
    sent = worker.requests[-1]
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    params = sent["params"]
    assert (params["max_tokens"], params["stop"], params["temperature"], params["top_p"], params["top_k"]) == (
        16, ["END"], 0.5, 0.9, 40)


def test_stream_follows_anthropics_event_sequence(server, client):
    with client.messages.stream(model=MODEL, max_tokens=16, messages=HELLO) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == "Hi there" and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 2
    raw = httpx.post(f"{server.url}/v1/messages", timeout=30, headers={"x-api-key": server.api_key},
                     json={"model": MODEL, "max_tokens": 16, "messages": HELLO, "stream": True})
    names = [line[len("event: "):] for line in raw.text.splitlines() if line.startswith("event: ")]
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
                     "content_block_stop", "message_delta", "message_stop"], names
    assert "text" in kinds and kinds[-1] == "message_stop"


def call_reply(arguments: str = '{"city": "Paris"}') -> Reply:
    call = ToolCall(id="toolu_" + "1" * 24, name="get_weather", arguments=arguments)
    return Reply([Accepted(prompt_tokens=5, prompt_ids=[1, 2, 3, 4, 5], seeds=[7]),
                  Token(index=0, token_id=10, text=""),
                  ToolCallDelta(index=0, call=0, id=call.id, name=call.name, arguments=arguments[:9]),
                  ToolCallDelta(index=0, call=0, arguments=arguments[9:]),
                  Finish(index=0, reason="tool_calls", text="", token_ids=[10], seed=7, tool_calls=[call]),
                  Done(prompt_tokens=5, completion_tokens=1, compute_tokens=1)])


def test_a_tool_round_trip(client, worker):
    worker.replies = [call_reply(), call_reply(), Reply(tokens("Sunny in Paris"))]
    first = client.messages.create(model=MODEL, max_tokens=32, messages=[{"role": "user", "content": "Paris?"}],
                                   tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"})
    (use,) = first.content
    assert first.stop_reason == "tool_use" and use.type == "tool_use" and use.input == {"city": "Paris"}
    sent = worker.requests[-1]["tools"]
    assert (sent["choice"], sent["function"], sent["parallel_calls"]) == ("function", "get_weather", False)
    with client.messages.stream(model=MODEL, max_tokens=32, messages=[{"role": "user", "content": "Paris?"}],
                                tools=[WEATHER]) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].type == "tool_use" and streamed.content[0].input == {"city": "Paris"}
    answer = client.messages.create(model=MODEL, max_tokens=32, tools=[WEATHER], messages=[
        {"role": "user", "content": "Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                          {"type": "tool_use", "id": use.id, "name": use.name, "input": use.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"},
                                     {"type": "text", "text": "And so?"}]}])
    assert answer.content[0].text == "Sunny in Paris"
    assert worker.requests[-1]["messages"][1:] == [
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": use.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "sunny"},
        {"role": "user", "content": "And so?"}]


def test_count_tokens(client, worker):
    counted = client.messages.count_tokens(model=MODEL, system="Be brief.", messages=HELLO)
    assert counted.input_tokens == 4  # the protocol worker: one token per word of the contents
    assert worker.requests == []  # a tokenizer call, not a generation


def test_x_api_key_and_bearer_both_authenticate(server):
    body = {"model": MODEL, "max_tokens": 4, "messages": HELLO}
    for headers in ({"x-api-key": server.api_key, "anthropic-version": "2023-06-01"},
                    {"authorization": f"Bearer {server.api_key}"}):
        reply = httpx.post(f"{server.url}/v1/messages", json=body, headers=headers, timeout=30)
        assert reply.status_code == 200 and reply.json()["type"] == "message", reply.text


@pytest.mark.parametrize(("call", "error", "status", "kind"), [
    (lambda c: c.messages.create(model=MODEL, max_tokens=4, messages=HELLO, extra_body={"temperature": 3}),
     anthropic.BadRequestError, 400, "invalid_request_error"),
    (lambda c: c.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "system", "content": "x"}]),
     anthropic.BadRequestError, 400, "invalid_request_error"),
    (lambda c: c.messages.create(model=MODEL, max_tokens=4, messages=HELLO, extra_body={"max_token": 3}),
     anthropic.BadRequestError, 400, "invalid_request_error"),
    (lambda c: c.messages.create(model="no-such-model", max_tokens=4, messages=HELLO),
     anthropic.NotFoundError, 404, "not_found_error"),
    (lambda c: anthropic.Anthropic(base_url=str(c.base_url), api_key="sk-sluice-000000000000-nope",
                                   max_retries=0).messages.create(model=MODEL, max_tokens=4, messages=HELLO),
     anthropic.AuthenticationError, 401, "authentication_error"),
])
def test_typed_errors(client, call, error, status, kind):
    with pytest.raises(error) as info:
        call(client)
    assert info.value.status_code == status
    assert info.value.body == {"type": "error", "error": {"type": kind, "message": info.value.body["error"]["message"]}}


def test_full_workers_are_anthropics_529_overloaded(client, worker):
    worker.replies = [Reply.refused(429, "overloaded", "the queue is full")] * 8  # every retry elsewhere too
    with pytest.raises(anthropic.OverloadedError) as info:
        client.with_options(max_retries=0).messages.create(model=MODEL, max_tokens=4, messages=HELLO)
    assert info.value.status_code == 529 and info.value.body["error"]["type"] == "overloaded_error"
    assert info.value.response.headers.get("retry-after") == "1"  # the 429's Retry-After stays (old main: none)


def test_a_context_overflow_in_anthropics_words(client, worker):
    worker.replies = [Reply(status=422, error=Error(kind="too_long", message="too long", field="prompt",
                                                    max_context=2048, prompt_tokens=3000))]
    with pytest.raises(anthropic.BadRequestError) as info:
        client.messages.create(model=MODEL, max_tokens=4, messages=HELLO)
    assert info.value.body["error"]["message"] == "prompt is too long: 3000 tokens > 2048 maximum"


def test_usage_is_in_the_ledger_as_anthropic(server, client):
    client.messages.create(model=MODEL, max_tokens=4, messages=HELLO)

    def dialects() -> dict:
        usage = httpx.get(f"{server.url}/v1/usage", headers={"authorization": f"Bearer {server.api_key}"},
                          params={"group_by": "dialect"}, timeout=30)
        assert usage.status_code == 200, usage.text
        return {row["key"]: row for row in usage.json()["rows"]}

    deadline = time.monotonic() + 60  # the ledger ships its records to the database in the background
    while "anthropic" not in dialects() and time.monotonic() < deadline:
        time.sleep(0.2)
    row = dialects()["anthropic"]
    assert row["requests"] >= 1 and row["completion_tokens"] >= 2, row


def test_the_tenant_rules_hold_on_the_anthropic_routes(server, worker):
    """Another team's private endpoint is unknown here (404), a model outside the key's allow-list is refused (403),
    on `messages` and `count_tokens` alike, in Anthropic's envelope; nothing reaches the worker."""
    other = admin(server, "POST", "/admin/teams", name="anthropic-other")
    admin(server, "POST", "/admin/endpoints", name="other/private", team_id=other["id"],
          provisioner={"kind": "static", "urls": [worker.url]})
    teams = admin(server, "GET", "/admin/teams")["data"]
    default = next(team["id"] for team in teams if team["name"] == "default")
    barred = admin(server, "POST", "/admin/keys", name="barred", team_id=default, models=["some-other-model"])["key"]
    for key, model, error in ((server.api_key, "other/private", anthropic.NotFoundError),
                              (barred, MODEL, anthropic.PermissionDeniedError)):
        client = anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0)
        with pytest.raises(error):
            client.messages.create(model=model, max_tokens=4, messages=HELLO)
        with pytest.raises(error):
            client.messages.count_tokens(model=model, messages=HELLO)
    assert worker.requests == []
