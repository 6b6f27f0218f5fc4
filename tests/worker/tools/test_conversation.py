"""A conversation that goes on after tool results, on SmolLM2's template (no tools slot) and on a tools-aware
template (Hermes-style `<tool_call>` tags) over the same weights: both render and generate valid calls."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest

from common.protocol import Finish, ToolCallDelta
from testkit.corpora.tools import HERMES_TEMPLATE, HISTORY, TOOLS
from tests.worker.engine.runs import running_engine, submit
from tests.worker.tools.helpers import chat, check_calls, post_all

pytestmark = pytest.mark.slow
NAMES = {t.name for t in TOOLS}


def test_conversation_goes_on_after_tool_results(worker_url, smol):
    auto, required = post_all(worker_url, [chat(HISTORY, "auto", max_tokens=24), chat(HISTORY, "required")])
    for reply in (auto, required):
        assert reply.status == 200, reply.body
        prompt = smol.tokenizer.decode(reply.accepted.prompt_ids)
        assert '<|im_start|>assistant\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
        assert "<|im_start|>tool\n18 C, cloudy<|im_end|>" in prompt and "21:04" in prompt
        check_calls(reply.finish, NAMES)
        assert reply.done.prompt_tokens == len(reply.accepted.prompt_ids)
        assert reply.done.completion_tokens == len(reply.finish.token_ids)
    assert required.finish.tool_calls


@pytest.fixture(scope="module")
def hermes_engine(smol):
    twin = copy.deepcopy(smol.tokenizer)
    twin.chat_template = HERMES_TEMPLATE
    with running_engine(dataclasses.replace(smol, tokenizer=twin), "tools-hermes", max_batch_size=4,
                        max_context=1024) as running:
        yield running


@pytest.mark.parametrize("choice", ["required", "function"])
def test_tools_aware_template_calls_in_its_own_syntax(hermes_engine, choice):
    request = chat(HISTORY, choice, function="get_time" if choice == "function" else None, parallel=False,
                   max_tokens=48)
    run = submit(hermes_engine, request, strict=True).wait()
    (finish,) = run.of(Finish)
    written = hermes_engine.tokenizer.decode(finish.token_ids, skip_special_tokens=True)
    assert written.startswith('<tool_call>\n{"name": "'), written
    check_calls(finish, {"get_time"} if choice == "function" else NAMES)
    if finish.reason == "tool_calls":
        call = finish.tool_calls[0]
        assert written == f'<tool_call>\n{{"name": "{call.name}", "arguments": {call.arguments}}}\n</tool_call>'
        assert json.loads(call.arguments) is not None and finish.text == ""
    assert "".join(d.arguments for d in run.of(ToolCallDelta)) == "".join(c.arguments for c in finish.tool_calls)
