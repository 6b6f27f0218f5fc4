"""Chat tool calling at the gateway: tools / tool_choice / parallel_tool_calls / tool_prompt -> ToolSpec, tool
turns in the history, every validation rule, and the rendering of the worker's calls (message and deltas)."""

from __future__ import annotations

import asyncio
import json

import pytest

from common.protocol import Done, Finish, Token, ToolCall, ToolCallDelta
from gateway.dialects.openai.chat import OpenAIChat
from gateway.errors import ValidationFailed
from gateway.serving.collect import Result
from gateway.serving.dialect import Meta

CHAT = OpenAIChat()
FRIENDLI = OpenAIChat(friendli=True)
USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}


def parse(extra: dict, dialect=CHAT):
    return dialect.parse({"model": "m", "messages": USER, **extra}, "/v1/chat/completions")


def refused(extra: dict) -> ValidationFailed:
    with pytest.raises(ValidationFailed) as info:
        parse(extra)
    assert info.value.status == 422
    return info.value


def test_tools_become_the_workers_tool_spec():
    spec = parse({"tools": [WEATHER, TIME]}).requests[0].tools
    assert [f.name for f in spec.functions] == ["get_weather", "get_time"]
    assert spec.functions[0].parameters == WEATHER["function"]["parameters"]
    assert spec.functions[1].parameters is None and spec.functions[0].description == "Current weather"
    assert (spec.choice, spec.function, spec.parallel_calls, spec.prompt) == ("auto", None, True, None)


@pytest.mark.parametrize(("tool_choice", "mode", "forced"), [
    ("none", "none", None), ("auto", "auto", None), ("required", "required", None),
    ({"type": "function", "function": {"name": "get_time"}}, "function", "get_time"),
    ("get_time", "function", "get_time"),  # TGI: a function's name as the string
])
def test_tool_choice_forms(tool_choice, mode, forced):
    spec = parse({"tools": [WEATHER, TIME], "tool_choice": tool_choice}).requests[0].tools
    assert (spec.choice, spec.function) == (mode, forced)


def test_parallel_calls_and_tgi_tool_prompt():
    spec = parse({"tools": [WEATHER], "parallel_tool_calls": False, "tool_prompt": "Use a tool:"}).requests[0].tools
    assert spec.parallel_calls is False and spec.prompt == "Use a tool:"


def test_no_tools_means_no_spec():
    assert parse({"tools": None, "tool_choice": "none"}).requests[0].tools is None
    assert parse({"tools": []}).requests[0].tools is None


@pytest.mark.parametrize(("extra", "param", "words"), [
    ({"tools": {"f": 1}}, "tools", "array"),
    ({"tools": ["f"]}, "tools[0]", "object"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools[0].type", "function"),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "object"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name", "letters"),
    ({"tools": [{"type": "function", "function": {"name": "x" * 65}}]}, "tools[0].function.name", "64"),
    ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools[0].function.name", "letters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "description": 3}}]},
     "tools[0].function.description", "string"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
     "tools[0].function.parameters", "schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "objekt"}}}]},
     "tools[0].function.parameters", "not a valid JSON schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"minLength": -1}}}}}]}, "tools[0].function.parameters", "properties/a"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]},
     "tools[0].function.parameters", "object"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name", "twice"),
    ({"tools": [WEATHER] * 129}, "tools", "at most 128"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "none, auto, required"),
    ({"tools": [WEATHER], "tool_choice": 3}, "tool_choice", "str"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice",
     "not in tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice", "function"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice", "needs tools"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls", "needs tools"),
    ({"tools": [WEATHER], "tool_prompt": 5}, "tool_prompt", "str"),
    ({"functions": [{"name": "f"}]}, "functions", "use tools"),
    ({"function_call": "auto"}, "functions", "use tools"),
])
def test_invalid_tools_name_the_field(extra, param, words):
    error = refused(extra)
    assert error.param == param and words in error.message


def test_friendli_422_carries_the_field_in_detail():
    with pytest.raises(ValidationFailed) as info:
        parse({"tools": [WEATHER, WEATHER]}, FRIENDLI)
    status, body = FRIENDLI.error_body(info.value)
    assert status == 422 and body["detail"][0]["loc"] == ["body", "tools[1].function.name"]


def test_tool_turns_reach_the_worker_in_openai_shapes():
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = USER + [{"role": "assistant", "content": None, "tool_calls": [call]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    sent = CHAT.parse({"model": "m", "messages": messages, "tools": [WEATHER]}, "/v1/chat/completions")
    assert sent.requests[0].messages[1:] == [{"role": "assistant", "content": None, "tool_calls": [call]},
                                             {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]


@pytest.mark.parametrize("turn", [
    {"role": "tool", "content": "18 C"},
    {"role": "tool", "tool_call_id": 7, "content": "18 C"},
    {"role": "user", "content": "x", "tool_calls": []},
    {"role": "assistant", "tool_calls": {"id": "c"}},
    {"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]},
    {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": 5}}]},
    {"role": "assistant", "tool_calls": [{"id": 5, "function": {"name": "f", "arguments": "{}"}}]},
])
def test_malformed_tool_turns_are_refused(turn):
    with pytest.raises(ValidationFailed) as info:
        CHAT.parse({"model": "m", "messages": USER + [turn]}, "/v1/chat/completions")
    assert info.value.param == "messages" and "messages[1]" in info.value.message


CALL = ToolCall("call_abc", "get_weather", '{"city": "Paris"}')
META = Meta("r1", 1, "m")


def test_calls_render_as_message_tool_calls_with_finish_reason_tool_calls():
    parsed = parse({"tools": [WEATHER]})
    result = Result()
    for event in (Finish(index=0, reason="tool_calls", text="", token_ids=[1], seed=1, tool_calls=[CALL]),
                  Done(prompt_tokens=3, completion_tokens=1, compute_tokens=1)):
        result.add(event)
    choice = CHAT.render(parsed, [result], META)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}


async def _chunks(parsed, events) -> list:
    async def source():
        for event in events:
            yield 0, event
    out = [chunk async for chunk in CHAT.stream(parsed, source(), META)]
    return [json.loads(c.decode()[len("data: "):]) for c in out if b"[DONE]" not in c]


def test_calls_stream_as_openai_tool_call_deltas():
    parsed = parse({"tools": [WEATHER], "stream": True})
    events = [Token(index=0, token_id=5, text="Checking."),
              ToolCallDelta(index=0, call=0, arguments='{"ci', id="call_abc", name="get_weather"),
              Token(index=0, token_id=6, text=""),
              ToolCallDelta(index=0, call=0, arguments='ty": "Paris"}'),
              Finish(index=0, reason="tool_calls", text="Checking.", token_ids=[5, 6], seed=1, tool_calls=[CALL]),
              Done(prompt_tokens=3, completion_tokens=2, compute_tokens=2)]
    deltas = [c["choices"][0] for c in asyncio.run(_chunks(parsed, events))]
    assert deltas[1]["delta"] == {"content": "Checking."}
    assert deltas[2]["delta"] == {"tool_calls": [{"index": 0, "id": "call_abc", "type": "function",
                                                  "function": {"name": "get_weather", "arguments": '{"ci'}}]}
    assert deltas[3]["delta"] == {"tool_calls": [{"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]}
    assert deltas[4]["finish_reason"] == "tool_calls" and deltas[4]["delta"] == {}
