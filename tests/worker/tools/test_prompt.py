"""Rendering chats with tools: the SmolLM2 template has no tools slot (the tool prompt path); a template that
reads `tools` renders them itself. Earlier calls and tool results render in both."""

from __future__ import annotations

import copy
import json

import pytest

from common.protocol import ToolSpec
from testkit.corpora.tools import HERMES_TEMPLATE, HISTORY, TOOLS, WEATHER
from worker.tools.errors import ToolError
from worker.tools.prompt import DEFAULT_TOOL_PROMPT, SEPARATOR, call_syntax, reads_tools, render_chat
from worker.tools.syntax import JSON_CALLS, TAGGED_CALLS


@pytest.fixture(scope="module")
def tokenizer(smol):
    return smol.tokenizer


@pytest.fixture(scope="module")
def hermes_tokenizer(smol):
    twin = copy.deepcopy(smol.tokenizer)
    twin.chat_template = HERMES_TEMPLATE
    return twin


def spec(choice="auto", **fields) -> ToolSpec:
    return ToolSpec(functions=TOOLS, choice=choice, **fields)


def test_smollm2_template_has_no_tools_slot(tokenizer, hermes_tokenizer):
    assert not reads_tools(tokenizer.chat_template)
    assert reads_tools(HERMES_TEMPLATE)
    assert call_syntax(tokenizer, spec()) == JSON_CALLS
    assert call_syntax(hermes_tokenizer, spec()) == TAGGED_CALLS


def test_tool_prompt_path_appends_tgi_default_text_and_definitions(tokenizer):
    text = render_chat(tokenizer, [{"role": "user", "content": "Hi"}], spec(), True)
    tail = text.split("Hi" + SEPARATOR, 1)[1]
    assert tail.startswith(DEFAULT_TOOL_PROMPT)
    listed = json.loads(tail[len(DEFAULT_TOOL_PROMPT):].split("\n", 1)[0])
    assert [t["function"]["name"] for t in listed] == [t.name for t in TOOLS]
    assert listed[0]["function"]["parameters"] == WEATHER.parameters
    assert 'reply with {"name": "<tool name>", "arguments": {<arguments>}}' in tail
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_custom_tool_prompt_replaces_the_default(tokenizer):
    text = render_chat(tokenizer, [{"role": "user", "content": "Hi"}], spec(prompt="Use these tools:\n"), True)
    assert DEFAULT_TOOL_PROMPT not in text and "Hi" + SEPARATOR + "Use these tools:\n[{" in text


def test_named_choice_shows_only_that_function_and_none_shows_nothing(tokenizer):
    named = render_chat(tokenizer, [{"role": "user", "content": "Hi"}], spec("function", function="get_time"), True)
    assert '"get_time"' in named and '"get_weather"' not in named and '"search_flights"' not in named
    plain = render_chat(tokenizer, [{"role": "user", "content": "Hi"}], None, True)
    assert render_chat(tokenizer, [{"role": "user", "content": "Hi"}], spec("none"), True) == plain
    assert plain == tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                                  add_generation_prompt=True)


def test_history_renders_calls_as_the_model_writes_them(tokenizer):
    text = render_chat(tokenizer, HISTORY, spec(), True)
    assert ('<|im_start|>assistant\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '{"name": "get_time", "arguments": {"timezone": "JST"}}<|im_end|>') in text
    assert "<|im_start|>tool\n18 C, cloudy<|im_end|>" in text
    assert "<|im_start|>tool\n21:04" in text  # text parts joined; the tool text follows the last message
    without_tools = render_chat(tokenizer, HISTORY, None, True)  # the history renders without tools too
    assert '{"name": "get_time", "arguments": {"timezone": "JST"}}' in without_tools
    assert DEFAULT_TOOL_PROMPT not in without_tools


def test_tools_aware_template_renders_tools_and_calls_itself(hermes_tokenizer):
    text = render_chat(hermes_tokenizer, HISTORY, spec(prompt="Be brief."), True)
    assert text.startswith("<|im_start|>system\nTools:\n")
    assert json.loads(text.split("\n")[2])["function"]["name"] == "get_weather"
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text  # an object
    assert DEFAULT_TOOL_PROMPT not in text and "21:04" + SEPARATOR + "Be brief." in text


@pytest.mark.parametrize("message,needle", [
    ({"role": "assistant", "tool_calls": "call it"}, "messages[1].tool_calls must be a list"),
    ({"role": "assistant", "tool_calls": [{"function": {}}]}, "messages[1].tool_calls[0] needs function.name"),
    ({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}, "JSON text or an object"),
    ({"role": "user", "content": [{"type": "image_url"}]}, "messages[1].content must be text"),
])
def test_malformed_tool_turns_are_named(tokenizer, message, needle):
    with pytest.raises(ToolError) as caught:
        render_chat(tokenizer, [{"role": "user", "content": "Hi"}, message], spec(), True)
    assert needle in caught.value.message and caught.value.field == "messages"
