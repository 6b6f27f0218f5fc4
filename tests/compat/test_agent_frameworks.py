"""Tools together with structured output (issue #49 item 1), through the real clients that send both, against
`sluice serve` with the real model: an openai-agents `Agent(tools=[...], output_type=...)` on the Responses and the
chat completions model classes (a tool round trip, then a typed final answer), instructor in its Responses and
tools modes, and openai's `chat.completions.parse(..., tools=...)`. Old main answered each first turn 400
"response_format cannot be combined with tools". Each framework runs in its own virtualenv (tests/compat/venvs.py):
their openai pins clash."""

from __future__ import annotations

import openai
import pydantic
import pytest

from testkit.sluice import MODEL
from tests.compat.sdk_pins import INSTRUCTOR, OPENAI_AGENTS
from tests.compat.venvs import run_in_venv

pytestmark = pytest.mark.slow

AGENT = '''
import asyncio, dataclasses, json, os
import pydantic
from agents import (Agent, AgentHooks, ModelSettings, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner,
                    function_tool, set_tracing_disabled)
from openai import AsyncOpenAI

set_tracing_disabled(True)
client = AsyncOpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["API_KEY"], max_retries=0)
looked_up = []


@function_tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    looked_up.append(city)
    return f"It is sunny and 24 degrees in {city}."


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=24)
    summary: str = pydantic.Field(max_length=48)


class AnswerAfterTheTool(AgentHooks):
    """Once the tool ran, the model answers (tool_choice none): a model this small would call it again."""

    async def on_tool_end(self, context, agent, tool, result):
        agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="none")


async def main():
    results = {}
    for kind in ("responses", "chat"):
        model = (OpenAIResponsesModel(model=os.environ["MODEL"], openai_client=client) if kind == "responses"
                 else OpenAIChatCompletionsModel(model=os.environ["MODEL"], openai_client=client))
        agent = Agent(name="weather", instructions="Look the weather up with the tool, then report it.",
                      tools=[get_weather], output_type=Weather, model=model, hooks=AnswerAfterTheTool(),
                      reset_tool_choice=False,
                      model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0,
                                                   max_tokens=96))
        before = len(looked_up)
        result = await Runner.run(agent, "What's the weather in Paris?", max_turns=4)
        results[kind] = {"type": type(result.final_output).__name__, "final": result.final_output.model_dump(),
                         "tool_runs": len(looked_up) - before, "items": [item.type for item in result.new_items]}
    print(json.dumps(results))


asyncio.run(main())
'''

INSTRUCTOR_SCRIPT = '''
import json, os
import instructor, openai, pydantic

client = openai.OpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["API_KEY"], max_retries=0)


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    country: str = pydantic.Field(max_length=24)


results = {}
for mode in ("responses_tools", "tool_call"):
    patched = instructor.from_openai(client, mode=instructor.Mode(mode))
    ask = "Name the capital of France."
    if mode == "responses_tools":  # sends text.format with a named function tool
        city = patched.responses.create(model=os.environ["MODEL"], response_model=City, max_retries=0,
                                        temperature=0, max_output_tokens=64, input=ask)
    else:
        city = patched.chat.completions.create(model=os.environ["MODEL"], response_model=City, max_retries=0,
                                               temperature=0, max_tokens=64,
                                               messages=[{"role": "user", "content": ask}])
    results[mode] = {"type": type(city).__name__, **city.model_dump()}
print(json.dumps(results))
'''


def _env(server) -> dict[str, str]:
    return {"BASE_URL": server.url, "API_KEY": server.api_key, "MODEL": MODEL}


def test_an_agent_with_tools_and_an_output_type_on_both_model_classes(sluice_on_smol):
    results = run_in_venv("openai-agents", OPENAI_AGENTS, AGENT, _env(sluice_on_smol), timeout=900)
    for kind in ("responses", "chat"):
        run = results[kind]
        assert run["type"] == "Weather" and run["tool_runs"] == 1, run  # one call: parallel_tool_calls false
        assert "tool_call_item" in run["items"] and "tool_call_output_item" in run["items"], run
        assert run["final"]["city"]  # the typed answer of the second turn


def test_instructor_responses_and_tools_modes(sluice_on_smol):
    results = run_in_venv("instructor", INSTRUCTOR, INSTRUCTOR_SCRIPT, _env(sluice_on_smol), timeout=600)
    for mode in ("responses_tools", "tool_call"):
        assert results[mode]["type"] == "City" and results[mode]["country"], results


class Weather(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=24)


class Answer(pydantic.BaseModel):
    answer: str = pydantic.Field(max_length=40)


def test_chat_completions_parse_with_tools(sluice_on_smol):
    client = openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key=sluice_on_smol.api_key, max_retries=0)
    messages = [{"role": "user", "content": "What's the weather in Paris?"}]
    tools = [openai.pydantic_function_tool(Weather, name="get_weather")]
    first = client.chat.completions.parse(model=MODEL, messages=messages, tools=tools, response_format=Answer,
                                          tool_choice="required", parallel_tool_calls=False, temperature=0,
                                          max_tokens=64)
    message = first.choices[0].message
    (call,) = message.tool_calls
    assert call.function.name == "get_weather" and isinstance(call.function.parsed_arguments, Weather)
    messages += [message.model_dump(exclude_none=True, exclude={"parsed"}),
                 {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees."}]
    final = client.chat.completions.parse(model=MODEL, messages=messages, tools=tools, response_format=Answer,
                                          tool_choice="none", temperature=0, max_tokens=64)
    assert isinstance(final.choices[0].message.parsed, Answer)
    auto = client.chat.completions.parse(model=MODEL, messages=messages[:1], tools=tools, response_format=Answer,
                                         temperature=0, max_tokens=64)
    reply = auto.choices[0].message  # auto: calls or the typed answer, either parses
    assert reply.tool_calls or isinstance(reply.parsed, Answer)
