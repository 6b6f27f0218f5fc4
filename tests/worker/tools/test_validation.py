"""What only the worker can check about tools, and what its parser relies on, is a 422 naming the field
before anything reaches the batch."""

from __future__ import annotations

import pytest

from common.protocol import Constraint, FunctionTool, GenerateRequest, SamplingParams, ToolSpec
from testkit.corpora.tools import TIME, TOOLS, WEATHER
from tests.worker.tools.helpers import chat, post


def tool(name: str = "f", parameters=None) -> FunctionTool:
    return FunctionTool(name=name, parameters=parameters)


CASES = [
    ("invalid schema", dict(tools=[WEATHER, tool("f", {"type": 5})]), "tools[1].function.parameters",
     "invalid JSON schema"),
    ("unsupported keyword", dict(tools=[tool("f", {"type": "object", "properties": {"a": {"not": {}}}})]),
     "tools[0].function.parameters", "unsupported schema feature at #/properties/a/not"),
    ("xgrammar refuses", dict(tools=[TIME, tool("f", {"type": "integer", "minimum": 5, "maximum": 1})]),
     "tools[1].function.parameters", "minimum greater than maximum"),
    ("unresolvable ref", dict(tools=[tool("f", {"$ref": "#/$defs/missing"})]), "tools[0].function.parameters",
     "missing"),
    ("checked even for none", dict(choice="none", tools=[tool("f", {"type": "object", "if": {}})]),
     "tools[0].function.parameters", "'if'/'then'/'else' is not supported"),
    ("duplicate name", dict(tools=[WEATHER, TIME, WEATHER]), "tools[2].function.name", "used twice"),
    ("bad name", dict(tools=[tool('get "x"')]), "tools[0].function.name", "letters, digits"),
    ("empty name", dict(tools=[tool("")]), "tools[0].function.name", "letters, digits"),
    ("long name", dict(tools=[tool("x" * 65)]), "tools[0].function.name", "1 to 64"),
    ("named not in tools", dict(choice="function", function="get_time", tools=[WEATHER]), "tool_choice",
     "not in tools"),
    ("named without name", dict(choice="function", tools=[WEATHER]), "tool_choice", "needs the function's name"),
    ("no functions", dict(choice="auto", tools=[]), "tools", "at least one function"),
    ("required without functions", dict(choice="required", tools=[]), "tools", "at least one function"),
    ("with an ebnf answer that does not parse", dict(choice="auto", constraint=Constraint("ebnf", "root ::= (")),
     "response_format", "invalid ebnf"),
    ("with beams", dict(num_beams=2, stream=False), "tools", "beam search"),
    ("with min_tokens", dict(min_tokens=2), "min_tokens", "the grammar decides"),
    ("malformed tool turn", dict(prompt=[{"role": "user", "content": "Hi"}, {"role": "assistant", "tool_calls": 3}]),
     "messages", "messages[1].tool_calls must be a list"),
]


@pytest.mark.parametrize("case,fields,field,needle", CASES, ids=[c[0] for c in CASES])
def test_refused_with_the_field_named(worker_url, tools_engine, case, fields, field, needle):
    fields = dict(fields)
    prompt = fields.pop("prompt", "What's the weather in Paris?")
    choice = fields.pop("choice", "required")
    request = chat(prompt, choice, function=fields.pop("function", None), tools=fields.pop("tools", TOOLS), **fields)
    before = tools_engine.load()
    reply = post(worker_url, request)
    assert reply.status == 422, reply.body
    assert reply.error["kind"] == "validation" and reply.error["field"] == field, reply.error
    assert needle in reply.error["message"], reply.error["message"]
    after = tools_engine.load()
    assert after.running_rows + after.queued <= before.running_rows + before.queued


def test_tools_need_a_chat(worker_url):
    request = GenerateRequest(request_id="tools-prompt", model="smol", prompt="Hello",
                              tools=ToolSpec(functions=[WEATHER]), params=SamplingParams(max_tokens=4))
    reply = post(worker_url, request)
    assert reply.status == 422 and reply.error["field"] == "tools" and "messages" in reply.error["message"]


def test_none_with_beams_and_response_format_is_an_ordinary_request(worker_url):
    request = chat("Say hi.", "none", num_beams=2, max_tokens=4, stream=False)
    assert post(worker_url, request).status == 200
    request = chat("Say hi.", "none", constraint=Constraint("regex", "(hi|hello)"), max_tokens=4)
    reply = post(worker_url, request)
    assert reply.status == 200 and reply.finish.text in ("hi", "hello") and not reply.finish.tool_calls
