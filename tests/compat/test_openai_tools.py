"""Tool calling through `sluice serve` with the real `openai` SDK and huggingface_hub's `chat_completion`.

Prompts x every tool_choice, streamed and not, through both SDKs (3 prompts in `make test`; the issue's proof is
SLUICE_TOOL_PROOF_PROMPTS=20): every call parses and validates against its function's schema, named choices
call only that function, required ones call at least one, none never calls; the streamed pieces rebuild a call
the way the SDK's users do, and every way of asking gets the same answer. A conversation continues with tool
results; usage is counted as for any chat; bad tools are a 400 the SDK raises (BadRequestError, as OpenAI's),
naming the field.
"""

from __future__ import annotations

import asyncio
import json
import os

import httpx
import jsonschema
import openai
import pytest
from huggingface_hub import AsyncInferenceClient

from testkit.corpora.tools import CHOICES, FLIGHTS, HISTORY, PROMPTS, SCHEMAS, WEATHER
from testkit.sluice import MODEL

pytestmark = pytest.mark.slow
TOOLS = [{"type": "function", "function": {"name": f.name, "description": f.description, "parameters": f.parameters}}
         for f in (WEATHER, FLIGHTS)]
NAMES = {t["function"]["name"] for t in TOOLS}
# `make test` asks a few prompts; the proof is all 20 (SLUICE_TOOL_PROOF_PROMPTS=20; -s prints the counts)
COUNT = min(int(os.environ.get("SLUICE_TOOL_PROOF_PROMPTS", 3)), len(PROMPTS))
SHORT_PROMPT = {"tool_prompt": "You can call these tools:\n"}  # TGI's field; its default text is long for CPU tests
SDKS = ("openai", "huggingface_hub")


def tool_choice(choice: str, number: int):
    if choice != "function":
        return choice
    return {"type": "function", "function": {"name": TOOLS[number % len(TOOLS)]["function"]["name"]}}


@pytest.fixture(scope="module")
def client(sluice_on_smol):
    return openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key=sluice_on_smol.api_key, max_retries=0)


def _arguments(call: dict) -> dict:
    return {"name": call["name"], "id": call["id"],  # huggingface_hub parses the JSON text into an object when it can
            "arguments": call["arguments"] if isinstance(call["arguments"], str) else json.dumps(call["arguments"])}


def _calls(reply: dict) -> list[tuple[str, object]]:
    """(name, arguments as parsed JSON, or as text when cut short) of each call, for comparisons."""
    found = []
    for call in reply["calls"]:
        try:
            found.append((call["name"], json.loads(call["arguments"])))
        except ValueError:
            found.append((call["name"], call["arguments"]))
    return found


def _usage(usage) -> tuple[int, int, int] | None:
    return None if usage is None else (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)


async def _ask(client: openai.AsyncOpenAI | AsyncInferenceClient, choice: str, number: int, stream: bool) -> dict:
    """One request through either SDK; the reply as {content, calls, finish_reason, usage}, rebuilt from the chunks
    when streamed (as the SDK's users do)."""
    arguments = dict(messages=[{"role": "user", "content": PROMPTS[number]}], tools=TOOLS,
                     tool_choice=tool_choice(choice, number), temperature=0, max_tokens=32)
    if isinstance(client, openai.AsyncOpenAI):
        arguments.update(model=MODEL, parallel_tool_calls=number % 2 == 0, extra_body=SHORT_PROMPT)
        ask = client.chat.completions.create
    else:
        arguments.update(tool_prompt=SHORT_PROMPT["tool_prompt"], extra_body={"parallel_tool_calls": number % 2 == 0})
        ask = client.chat_completion
    if not stream:
        reply = await ask(**arguments)
        message = reply.choices[0].message
        calls = [_arguments({"id": c.id, "name": c.function.name, "arguments": c.function.arguments})
                 for c in message.tool_calls or []]
        return {"content": message.content or "", "calls": calls, "finish_reason": reply.choices[0].finish_reason,
                "usage": _usage(reply.usage)}
    chunks = await ask(**arguments, stream=True, stream_options={"include_usage": True})
    content, calls, finish_reason, usage = "", {}, None, None
    async for chunk in chunks:
        usage = _usage(chunk.usage) or usage
        for choice_delta in chunk.choices:
            delta = choice_delta.delta
            content += delta.content or ""
            for piece in delta.tool_calls or []:
                if piece.id:
                    assert piece.type == "function" and piece.index not in calls
                    calls[piece.index] = {"id": piece.id, "name": piece.function.name, "arguments": ""}
                calls[piece.index]["arguments"] += piece.function.arguments or ""
            finish_reason = choice_delta.finish_reason or finish_reason
    return {"content": content, "calls": [calls[i] for i in sorted(calls)], "finish_reason": finish_reason,
            "usage": usage}


@pytest.fixture(scope="module", params=CHOICES)
def answers(request, sluice_on_smol):
    """(choice, {(prompt number, streamed, sdk): reply}) for every prompt, streamed and not, through both SDKs,
    sent at once."""
    async def run():
        url, key = f"{sluice_on_smol.url}/v1", sluice_on_smol.api_key
        async with (openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0, timeout=600) as openai_client,
                    AsyncInferenceClient(base_url=url, api_key=key, timeout=600) as hub_client):
            clients = {"openai": openai_client, "huggingface_hub": hub_client}
            keys = [(n, s, sdk) for n in range(COUNT) for s in (True, False) for sdk in clients]
            room = asyncio.Semaphore(32)  # under the team's 64 concurrent requests (the full proof sends 80)

            async def ask(number: int, streamed: bool, sdk: str) -> dict:
                async with room:
                    return await _ask(clients[sdk], request.param, number, streamed)
            replies = await asyncio.gather(*(ask(*key) for key in keys))
            return dict(zip(keys, replies))
    return request.param, asyncio.run(run())


def problems(choice: str, number: int, reply: dict) -> list[str]:
    """What is wrong with one reply under its tool_choice (nothing: it passes)."""
    found = []
    allowed = {tool_choice(choice, number)["function"]["name"]} if choice == "function" else NAMES
    cut = reply["finish_reason"] == "length"
    for index, call in enumerate(reply["calls"]):
        if call["name"] not in allowed or not call["id"].startswith("call_"):
            found.append(f"call {index}: {call['name']!r} (id {call['id']!r}) is not an allowed call")
        if cut and index == len(reply["calls"]) - 1:
            continue  # max_tokens may cut the last call
        try:
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS.get(call["name"], {}))
        except (ValueError, jsonschema.ValidationError) as error:
            found.append(f"call {index}: arguments {call['arguments']!r} do not validate: {error}")
    if choice == "none" and (reply["calls"] or reply["finish_reason"] not in ("stop", "length")):
        found.append("tool_choice none, yet a call")
    if choice in ("required", "function") and (not reply["calls"] or reply["content"] != ""):
        found.append(f"tool_choice {choice} without a call alone: {reply}")
    if number % 2 and len(reply["calls"]) > 1:
        found.append("parallel_tool_calls false, yet several calls")
    if reply["calls"] and not cut and reply["finish_reason"] != "tool_calls":
        found.append(f"calls but finish_reason {reply['finish_reason']!r}")
    return found


def test_calls_validate_and_follow_the_choice(answers):
    choice, replies = answers
    found = {key: problems(choice, key[0], reply) for key, reply in replies.items()}
    for sdk in SDKS:
        for streamed in (False, True):
            passed = sum(not found[(number, streamed, sdk)] for number in range(COUNT))
            print(f"{sdk} tool_choice={choice} {'streamed' if streamed else 'whole'}: {passed}/{COUNT} pass")
    assert not any(found.values()), {key: wrong for key, wrong in found.items() if wrong}


def test_streamed_and_whole_replies_agree_across_sdks(answers):
    _, replies = answers
    for number in range(COUNT):
        whole = replies[(number, False, "openai")]
        for other in [replies[(number, True, "openai")],
                      *(replies[(number, streamed, "huggingface_hub")] for streamed in (False, True))]:
            assert _calls(other) == _calls(whole)
            assert (other["content"], other["finish_reason"], other["usage"]) == \
                (whole["content"], whole["finish_reason"], whole["usage"])


def test_usage_counts_the_rendered_tools_as_prompt_tokens(client):
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}],
                                           max_tokens=4, temperature=0)
    tooled = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}],
                                            tools=TOOLS, tool_choice="required", max_tokens=32, temperature=0)
    assert tooled.usage.prompt_tokens > plain.usage.prompt_tokens + 50  # the tool definitions
    assert tooled.usage.total_tokens == tooled.usage.prompt_tokens + tooled.usage.completion_tokens


def test_conversation_continues_with_tool_results(client):
    reply = client.chat.completions.create(model=MODEL, messages=HISTORY, tools=TOOLS, tool_choice="none",
                                           max_tokens=24, temperature=0)
    assert reply.choices[0].message.content and not reply.choices[0].message.tool_calls
    # the SDK's own message objects go back into the history as they came out
    first = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[0]}],
                                           tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
                                           max_tokens=32, temperature=0)
    message = first.choices[0].message
    follow = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=16, tools=TOOLS,
        messages=[{"role": "user", "content": PROMPTS[0]}, message.model_dump(exclude_none=True),
                  {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "18 C, sunny"}])
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert follow.usage.prompt_tokens > first.usage.prompt_tokens


@pytest.mark.parametrize(("tools", "choice", "param"), [
    ([TOOLS[0], TOOLS[0]], "auto", "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "required": "x"}}}], "auto",
     "tools[0].function.parameters"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
])
def test_bad_tools_are_a_400_naming_the_field(client, tools, choice, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], tools=tools,
                                       tool_choice=choice)
    assert info.value.body["param"] == param


def test_a_schema_the_worker_cannot_enforce_is_a_400(client):
    # valid JSON schema, but a keyword the grammar cannot enforce: the worker's refusal names the field
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "not": {"const": "x"}}}}}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], tools=[tool],
                                       tool_choice="required", max_tokens=8)
    assert info.value.body["param"] == "tools[0].function.parameters"


@pytest.mark.parametrize(("prompt", "name"), [(PROMPTS[1], "get_weather"), (PROMPTS[0], "search_flights")])
def test_a_forced_tool_is_called_once_by_default(client, prompt, name):
    """Without `parallel_tool_calls`, a forced named tool is one call, as vLLM and TGI answer (these prompts made
    SmolLM2 call it twice, and frameworks ran the tool twice and paid for both)."""
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], tools=TOOLS,
                                           tool_choice={"type": "function", "function": {"name": name}},
                                           max_tokens=160, temperature=0, extra_body=SHORT_PROMPT)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
    assert choice.message.tool_calls[0].function.name == name


def test_friendli_chat_route_calls_tools(sluice_on_smol):
    reply = httpx.post(f"{sluice_on_smol.url}/serverless/v1/chat/completions", timeout=300,
                       headers={"authorization": f"Bearer {sluice_on_smol.api_key}"},
                       json={"model": MODEL, "messages": [{"role": "user", "content": PROMPTS[0]}], "tools": TOOLS,
                             "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                             "parallel_tool_calls": False, "max_tokens": 32, "temperature": 0, **SHORT_PROMPT})
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMAS["get_weather"])
    bad = httpx.post(f"{sluice_on_smol.url}/serverless/v1/chat/completions", timeout=60,
                     headers={"authorization": f"Bearer {sluice_on_smol.api_key}"},
                     json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": TOOLS * 2})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "tools[2].function.name"]
