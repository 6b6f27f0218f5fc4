"""A prefill (the last message is the assistant's) is continued, not closed (issue #49 item 2): the prompt is what
transformers' apply_chat_template(continue_final_message=True) makes of SmolLM2's template, the turn left open;
chat_template_kwargs: tests/security/test_chat_template_kwargs.py."""

from __future__ import annotations

import pytest

from common.protocol import ToolSpec
from testkit.corpora.tools import TOOLS
from worker.tools.errors import ToolError
from worker.tools.prompt import render_chat

PREFILL = [{"role": "user", "content": "What is the capital of France?"},
           {"role": "assistant", "content": "The capital of France is"}]


def test_a_prefill_renders_as_transformers_continues_it(smol):
    tokenizer = smol.tokenizer
    ours = render_chat(tokenizer, PREFILL, None, True, continue_final=True)
    theirs = tokenizer.apply_chat_template(PREFILL, tokenize=False, continue_final_message=True)
    assert ours == theirs
    assert ours.endswith("<|im_start|>assistant\nThe capital of France is")  # open: no <|im_end|>, no new turn
    closed = render_chat(tokenizer, PREFILL, None, True)  # what old main sent: the turn closed, another opened
    assert closed.endswith("The capital of France is<|im_end|>\n<|im_start|>assistant\n")


def test_tools_go_on_the_user_turn_not_on_the_prefill(smol):
    spec = ToolSpec(functions=TOOLS, choice="auto")
    rendered = render_chat(smol.tokenizer, PREFILL, spec, True, continue_final=True)
    assert rendered.endswith("<|im_start|>assistant\nThe capital of France is")
    assert TOOLS[0].name in rendered.split("<|im_start|>assistant")[-2]


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "  "}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}],
])
def test_only_a_final_assistant_text_can_be_continued(smol, messages):
    with pytest.raises(ToolError) as refused:
        render_chat(smol.tokenizer, messages, None, True, continue_final=True)
    assert refused.value.field == "messages"
