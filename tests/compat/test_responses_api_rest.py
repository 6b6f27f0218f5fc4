"""The rest of the Responses API (issue #49 item 4) through the real `openai` SDK against `sluice serve` with the
real model: `top_logprobs` with `include: ["message.output_text.logprobs"]`, `input_items.list` (old main: 404),
`input_tokens.count` (old main: 405), `max_tool_calls`, `stream_options`, and output items streamed in order (old
main opened the next function call's item before it closed the last one). Stored inputs stay their team's."""

from __future__ import annotations

import openai
import pytest

from testkit.admin import admin
from testkit.sluice import MODEL

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                          "required": ["city"]}}
TWO_CITIES = "What's the weather in Paris and in Rome?"


@pytest.fixture(scope="module")
def client(sluice_on_smol):
    return openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key=sluice_on_smol.api_key, max_retries=0)


def test_top_logprobs_are_included_when_asked(client):
    response = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=4, temperature=0,
                                       top_logprobs=2, include=["message.output_text.logprobs"])
    logprobs = response.output[0].content[0].logprobs
    assert len(logprobs) == response.usage.output_tokens
    assert "".join(entry.token for entry in logprobs) == response.output_text
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in logprobs)
    assert logprobs[0].top_logprobs[0].token == logprobs[0].token  # greedy: the chosen token ranks first
    with client.responses.stream(model=MODEL, input="Say hi.", max_output_tokens=4, temperature=0, top_logprobs=2,
                                 include=["message.output_text.logprobs"]) as stream:
        deltas = [event for event in stream if event.type == "response.output_text.delta"]
    assert [entry.token for delta in deltas for entry in delta.logprobs] == [entry.token for entry in logprobs]
    plain = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=2)
    assert plain.output[0].content[0].logprobs == []
    for bad in ({"top_logprobs": 21}, {"include": ["message.output_text.everything"]}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, **bad)
        assert refused.value.body["param"] in ("top_logprobs", "include")


def test_input_items_of_a_chained_response(client, sluice_on_smol):
    first = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=3, instructions="Be brief.")
    second = client.responses.create(model=MODEL, previous_response_id=first.id, max_output_tokens=3,
                                     input=[{"role": "user", "content": "And again?"}])
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [(item.type, item.role) for item in items] == [("message", "user"), ("message", "assistant"),
                                                          ("message", "user")]
    assert items[0].content[0].text == "Say hi." and items[1].content[0].text == first.output_text
    newest_first = client.responses.input_items.list(second.id)  # OpenAI's default order: desc
    assert [item.id for item in newest_first.data] == [item.id for item in reversed(items)]
    one = client.responses.input_items.list(second.id, order="asc", limit=1)
    assert one.has_more and [item.id for item in one.data] == [items[0].id]
    assert [item.id for item in one.get_next_page().data] == [items[1].id]  # the SDK's cursor: `after`
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(second.id, limit=101)
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(second.id, after="msg_not_in_this_response")
    with pytest.raises(openai.BadRequestError):
        client.responses.input_items.list(second.id, include=["message.everything"])
    other = admin(sluice_on_smol, "POST", "/admin/teams", name="input-items-other")
    stranger = openai.OpenAI(base_url=client.base_url, max_retries=0, api_key=admin(
        sluice_on_smol, "POST", "/admin/keys", name="input-items-stranger", team_id=other["id"])["key"])
    with pytest.raises(openai.NotFoundError):  # another team's response is as unknown as a missing one
        stranger.responses.input_items.list(second.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.input_tokens.count(model=MODEL, input="x", previous_response_id=second.id)


def test_input_tokens_count_what_a_response_is_prompted_with(client):
    counted = client.responses.input_tokens.count(model=MODEL, input="Say hi.", instructions="Be brief.")
    response = client.responses.create(model=MODEL, input="Say hi.", instructions="Be brief.", max_output_tokens=1)
    assert counted.object == "response.input_tokens" and counted.input_tokens == response.usage.input_tokens
    with_tools = client.responses.input_tokens.count(model=MODEL, input="Say hi.", tools=[WEATHER])
    called = client.responses.create(model=MODEL, input="Say hi.", tools=[WEATHER], max_output_tokens=1)
    assert with_tools.input_tokens == called.usage.input_tokens > counted.input_tokens


def test_output_items_stream_in_order_and_max_tool_calls_holds(client):
    with client.responses.stream(model=MODEL, input=TWO_CITIES, tools=[WEATHER], tool_choice="required",
                                 max_output_tokens=64, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    opened: list[int] = []
    for event in events:
        if event.type == "response.output_item.added":
            assert not opened or opened[-1] is None, "an item opened before the last one closed"
            opened.append(event.output_index)
        elif event.type == "response.output_item.done":
            assert opened and event.output_index == opened[-1]
            opened.append(None)
        elif event.type == "response.function_call_arguments.delta":
            assert opened[-1] == event.output_index
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) >= 2, final.output  # the model calls twice here: the case old main interleaved
    capped = client.responses.create(model=MODEL, input=TWO_CITIES, tools=[WEATHER], tool_choice="required",
                                     max_output_tokens=64, temperature=0, max_tool_calls=1)
    assert [item.type for item in capped.output] == ["function_call"]
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model=MODEL, input="Hi", tools=[WEATHER], max_tool_calls=0)


def test_stream_options_are_accepted(client):
    stream = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, stream=True,
                                     stream_options={"include_obfuscation": False})
    assert [event.type for event in stream][-1] in ("response.completed", "response.incomplete")


def test_a_format_the_worker_refuses_is_named_as_this_api_names_it(client):
    unenforceable = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object", "not": {}}}}
    for tools in ([WEATHER], None):  # old main: "response_format cannot be combined with tools", a field not here
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(model=MODEL, input="Hi", max_output_tokens=2, text=unenforceable,
                                    **({"tools": tools} if tools else {}))
        assert refused.value.body["param"] == "text.format", refused.value.body
        assert "response_format" not in refused.value.body["message"]


def test_a_prediction_changes_nothing_but_the_usage_it_reports(client):
    """Predicted Outputs on Responses (an extension: OpenAI has them on chat only; the SDK sends it as extra_body):
    the answer is the one without a prediction, usage says how much of it the answer took, and a bad prediction is
    this API's 400 naming `prediction`."""
    ask = {"model": MODEL, "input": "Repeat exactly: the cat sat on the mat, the dog sat on the log.",
           "max_output_tokens": 24, "temperature": 0}
    plain = client.responses.create(**ask)
    prediction = {"type": "content", "content": plain.output_text}
    predicted = client.responses.create(**ask, extra_body={"prediction": prediction})
    assert predicted.output_text == plain.output_text
    details = predicted.usage.output_tokens_details.to_dict()
    assert details["accepted_prediction_tokens"] > 0
    assert predicted.usage.output_tokens == plain.usage.output_tokens + details["rejected_prediction_tokens"]
    assert "accepted_prediction_tokens" not in plain.usage.output_tokens_details.to_dict()
    events = list(client.responses.create(**ask, stream=True, extra_body={"prediction": prediction}))
    assert events[-1].response.output_text == plain.output_text
    assert events[-1].response.usage.output_tokens_details.to_dict()["accepted_prediction_tokens"] > 0
    for bad in ({"type": "content", "content": 42}, {"type": "file", "content": "x"}, "not an object",
                {"type": "content", "content": "x " * 9000}):  # the last: longer than the model's context
        with pytest.raises(openai.BadRequestError) as refused:
            client.responses.create(**ask, extra_body={"prediction": bad})
        assert refused.value.body["param"] == "prediction", refused.value.body
    assert refused.value.body["code"] == "context_length_exceeded"
