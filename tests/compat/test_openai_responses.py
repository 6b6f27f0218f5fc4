"""OpenAI's Responses API through the real `sluice serve`, called with the real `openai` SDK (issue #34):
`responses.create`, `responses.stream` (OpenAI's event sequence), `responses.parse` into a pydantic model, a
function-tool round trip, a conversation continued by `previous_response_id`, retrieve and delete of stored
responses — visible to their team only — and hosted tools refused. The gateway serves the protocol worker
(testkit/protocol_worker.py), which plays the worker's side from a script: this is about the wire."""

from __future__ import annotations

import httpx
import openai
import pydantic
import pytest

from common.protocol import Accepted, Done, Finish, Token, ToolCall, ToolCallDelta
from testkit.admin import admin
from testkit.protocol_worker import MODEL, Reply, tokens

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def sdk(server, key: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key or server.api_key, max_retries=0)


def test_create_retrieve_delete(server, worker):
    client = sdk(server)
    response = client.responses.create(model=MODEL, input="Hello there", instructions="Be brief.",
                                       max_output_tokens=16, temperature=0.5)
    assert response.status == "completed" and response.output_text == "Hi there"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (3, 2)
    assert worker.requests[-1]["messages"] == [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hello there"}]
    assert client.responses.retrieve(response.id).output_text == "Hi there"
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    unstored = client.responses.create(model=MODEL, input="Hi", store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_a_cut_response_is_incomplete(server, worker):
    worker.replies = [Reply(tokens(reason="length"))]
    response = sdk(server).responses.create(model=MODEL, input="Hello", max_output_tokens=2)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"


def test_stream_follows_openais_event_sequence(server):
    with sdk(server).responses.stream(model=MODEL, input="Hello there") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
                     "response.output_text.done", "response.content_part.done", "response.output_item.done",
                     "response.completed"], kinds
    assert final.output_text == "Hi there" and final.status == "completed"
    assert sdk(server).responses.retrieve(final.id).output_text == "Hi there"  # a stream is stored too


class City(pydantic.BaseModel):
    city: str
    country: str


def test_parse_into_a_pydantic_model(server, worker):
    worker.replies = [Reply(tokens('{"city": "Paris", "country": "France"}'))]
    parsed = sdk(server).responses.parse(model=MODEL, input="A city as JSON", text_format=City)
    assert parsed.output_parsed == City(city="Paris", country="France")
    constraint = worker.requests[-1]["params"]["constraint"]
    assert constraint["kind"] == "json_schema" and '"country"' in constraint["value"]


def call_reply() -> Reply:
    call = ToolCall(id="call_" + "2" * 24, name="get_weather", arguments='{"city": "Paris"}')
    return Reply([Accepted(prompt_tokens=5, prompt_ids=[1, 2, 3, 4, 5], seeds=[7]),
                  Token(index=0, token_id=10, text=""),
                  ToolCallDelta(index=0, call=0, id=call.id, name=call.name, arguments=call.arguments),
                  Finish(index=0, reason="tool_calls", text="", token_ids=[10], seed=7, tool_calls=[call]),
                  Done(prompt_tokens=5, completion_tokens=1, compute_tokens=1)])


def test_a_function_tool_round_trip_continued_by_previous_response_id(server, worker):
    client = sdk(server)
    worker.replies = [call_reply(), Reply(tokens("Sunny in Paris")), Reply(tokens("You are welcome"))]
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                    tool_choice={"type": "function", "name": "get_weather"})
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.arguments == '{"city": "Paris"}'
    assert worker.requests[-1]["tools"]["function"] == "get_weather"
    second = client.responses.create(model=MODEL, previous_response_id=first.id, tools=[WEATHER], input=[
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert second.output_text == "Sunny in Paris"
    assert worker.requests[-1]["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}]
    client.responses.create(model=MODEL, previous_response_id=second.id, input="Thanks")
    assert worker.requests[-1]["messages"][-2:] == [{"role": "assistant", "content": "Sunny in Paris"},
                                                    {"role": "user", "content": "Thanks"}]


@pytest.mark.parametrize("tool", [{"type": "web_search_preview"}, {"type": "file_search", "vector_store_ids": ["v"]},
                                  {"type": "computer_use_preview", "display_width": 1, "display_height": 1,
                                   "environment": "browser"}])
def test_hosted_tools_are_refused(server, worker, tool):
    with pytest.raises(openai.BadRequestError) as info:
        sdk(server).responses.create(model=MODEL, input="x", tools=[tool])
    assert info.value.body["param"] == "tools" and tool["type"] in info.value.body["message"]
    assert worker.requests == []


def test_stored_responses_are_their_teams_only(server, worker):
    """Another team cannot read, delete or continue a team's response: 404, as for one that never existed."""
    mine = sdk(server).responses.create(model=MODEL, input="secret plans")
    other = admin(server, "POST", "/admin/teams", name="responses-other")
    stranger = sdk(server, admin(server, "POST", "/admin/keys", name="stranger", team_id=other["id"])["key"])
    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(mine.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.delete(mine.id)
    worker.requests.clear()
    with pytest.raises(openai.NotFoundError):
        stranger.responses.create(model=MODEL, previous_response_id=mine.id, input="and?")
    assert worker.requests == []
    assert sdk(server).responses.retrieve(mine.id).output_text == "Hi there"  # still there for its team


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x"}, "model"),
    ({"model": MODEL}, "input"),
    ({"model": MODEL, "input": "x", "temperature": 3}, "temperature"),
    ({"model": MODEL, "input": "x", "previous_response_id": 5}, "previous_response_id"),
    ({"model": MODEL, "input": [{"type": "input_image", "image_url": "x"}]}, "input"),
    ({"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
    ({"model": MODEL, "input": "x", "max_output_token": 5}, "max_output_token"),
])
def test_invalid_requests_are_openais_400(server, worker, body, param):
    reply = httpx.post(f"{server.url}/v1/responses", json=body, timeout=30,
                       headers={"authorization": f"Bearer {server.api_key}"})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param and reply.json()["error"]["type"] == "invalid_request_error"
    assert worker.requests == []


def test_the_tenant_rules_hold_on_responses(server, worker):
    """Another team's private endpoint is unknown (404) and a model outside the key's allow-list refused (403), as
    on chat; nothing reaches the worker."""
    other = admin(server, "POST", "/admin/teams", name="responses-private")
    admin(server, "POST", "/admin/endpoints", name="other/private", team_id=other["id"],
          provisioner={"kind": "static", "urls": [worker.url]})
    default = next(team["id"] for team in admin(server, "GET", "/admin/teams")["data"] if team["name"] == "default")
    barred = admin(server, "POST", "/admin/keys", name="barred", team_id=default, models=["some-other-model"])["key"]
    with pytest.raises(openai.NotFoundError):
        sdk(server).responses.create(model="other/private", input="x")
    with pytest.raises(openai.PermissionDeniedError):
        sdk(server, barred).responses.create(model=MODEL, input="x")
    assert worker.requests == []
