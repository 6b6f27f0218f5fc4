"""Tools together with structured output (issue #49 item 1): with `auto` the reply is either tool calls, as without
the constraint, or content valid for it, never free text; `required` and a named function still allow calls only;
`parallel_calls` false still ends after one call. On the real SmolLM2 worker; old main refused every such request
("response_format cannot be combined with tools")."""

from __future__ import annotations

import json

import jsonschema
import pytest
import xgrammar as xgr

from common.protocol import Constraint
from testkit.corpora.tools import PROMPTS, TOOLS
from tests.worker.tools.helpers import chat, check_calls, post_all
from worker.tools import plan_tools

ANSWER = {"type": "object", "required": ["answer"], "additionalProperties": False,
          "properties": {"answer": {"type": "string", "maxLength": 40}}}
NAMES = {tool.name for tool in TOOLS}


def _one_of_the_two(reply, schema) -> str:
    finish = reply.finish
    if finish.tool_calls:
        check_calls(finish, NAMES)
        assert finish.text == "" and finish.reason in ("tool_calls", "length"), finish
        return "calls"
    assert finish.reason != "length", finish  # the answer is complete within max_tokens
    jsonschema.validate(json.loads(finish.text), schema)
    assert reply.streamed_content() == finish.text
    return "answer"


@pytest.mark.parametrize("parallel", [True, False])
def test_auto_answers_with_calls_or_with_content_valid_for_the_schema(worker_url, parallel):
    constraint = Constraint("json_schema", json.dumps(ANSWER))
    requests = [chat(prompt, "auto", parallel=parallel, constraint=constraint, max_tokens=60) for prompt in PROMPTS]
    replies = post_all(worker_url, requests)
    kinds = [_one_of_the_two(reply, ANSWER) for reply in replies]
    assert "calls" in kinds  # the constraint does not take the tools away
    if not parallel:
        assert all(len(reply.finish.tool_calls) <= 1 for reply in replies)


def test_after_a_tool_result_the_answer_is_typed(worker_url):
    history = [{"role": "user", "content": "What's the weather like in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees."}]
    constraint = Constraint("json_schema", json.dumps(ANSWER))
    reply = post_all(worker_url, [chat(history, "auto", constraint=constraint, max_tokens=60)])[0]
    assert _one_of_the_two(reply, ANSWER) in ("calls", "answer")


@pytest.mark.parametrize("choice,function", [("required", None), ("function", "get_time")])
def test_forced_calls_stay_calls_only(worker_url, choice, function):
    constraint = Constraint("json_schema", json.dumps(ANSWER))
    replies = post_all(worker_url, [chat(prompt, choice, function=function, constraint=constraint, max_tokens=60)
                                    for prompt in PROMPTS[:6]])
    for reply in replies:
        assert reply.finish.tool_calls and reply.finish.text == ""
        check_calls(reply.finish, {function} if function else NAMES)


def test_the_grammar_takes_calls_or_the_answer_and_nothing_else(tools_engine):
    """The `or` itself, string by string (the model above never chose the answer branch on these prompts)."""
    request = chat("Hi", "auto", parallel=False, constraint=Constraint("json_schema", json.dumps(ANSWER)))
    plan = plan_tools(request, tools_engine.tokenizer, 0, tools_engine.grammars.compile)

    def complete(text: str) -> bool:
        matcher = xgr.GrammarMatcher(plan.grammar.compiled)
        return matcher.accept_string(text) and matcher.is_completed()

    assert complete('{"answer": "Rome"}')
    assert complete('{"name": "get_weather", "arguments": {"city": "Rome"}}')
    assert not complete('{"name": "get_weather", "arguments": {"city": "Rome"}}\n'
                        '{"name": "get_time", "arguments": {"timezone": "UTC"}}')  # parallel_calls false
    assert not complete("Rome is the capital.")  # free text: neither answer
    assert not complete('{"answer": "Rome"}\n{"name": "get_weather", "arguments": {"city": "Rome"}}')  # not both
    assert not complete('{"answer": "Rome", "extra": 1}')


def test_the_parser_reads_the_answer_as_content_and_calls_as_calls(tools_engine):
    request = chat("Hi", "auto", constraint=Constraint("json_object"))
    plan = plan_tools(request, tools_engine.tokenizer, 0, tools_engine.grammars.compile)
    content, deltas = plan.parser(0).push('{"name": "Rome", "size": 3}', final=True)
    assert content == '{"name": "Rome", "size": 3}' and not deltas  # a "name" key that is no function's head
    parser = plan.parser(0)
    content, _ = parser.push('{"name": "get_weather", "arguments": {"city": "Rome"}}\n{"name": "get_w', final=True)
    assert content == "" and [c.name for c in parser.calls] == ["get_weather", "get_weather"]  # a cut call stays one
