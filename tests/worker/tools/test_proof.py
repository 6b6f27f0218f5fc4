"""Tool calls through the worker's HTTP API on the real SmolLM2: prompts (10 in `make test`; the issue's proof is
SLUICE_TOOL_PROOF_PROMPTS=20) x every tool_choice, streamed and not. Every call parses and validates against its
schema; named choices call only that function, required ones call at least one, none never calls; the streamed
pieces rebuild exactly the calls and the content of the Finish event, and a request sent not streamed gets the
same calls as the streamed one (greedy).

Prefill is the cost here (the tool definitions make the prompts ~200 tokens): one batch per tool_choice."""

from __future__ import annotations

import os

import pytest

from testkit.corpora.tools import CHOICES, FLIGHTS, PROMPTS, WEATHER
from tests.worker.tools.helpers import chat, check_calls, post_all

pytestmark = pytest.mark.slow
TOOLS = [WEATHER, FLIGHTS]  # strings with maxLength and enum; patterns and an integer range
REPEATED = 4  # prompts also sent not streamed
PROMPTS = PROMPTS[:max(int(os.environ.get("SLUICE_TOOL_PROOF_PROMPTS", 10)), REPEATED)]
TOOL_PROMPT = "You can call these tools:\n"  # shorter than TGI's default (tested in test_prompt.py)


def named(number: int) -> str:
    return TOOLS[number % len(TOOLS)].name


@pytest.fixture(scope="module", params=CHOICES)
def batch(request, worker_url):
    """(choice, {(prompt number, streamed): reply}): every prompt streamed and the first ones not, at once."""
    choice = request.param
    keys = [(n, True) for n in range(len(PROMPTS))] + [(n, False) for n in range(REPEATED)]
    answers = post_all(worker_url, [
        chat(PROMPTS[n], choice, function=named(n) if choice == "function" else None, parallel=n % 2 == 0,
             stream=streamed, tools=TOOLS, tool_prompt=TOOL_PROMPT, max_tokens=32) for n, streamed in keys])
    return choice, dict(zip(keys, answers))


def test_calls_validate_and_follow_the_choice(batch):
    choice, replies = batch
    for number in range(len(PROMPTS)):
        reply = replies[(number, True)]
        assert reply.status == 200, reply.body
        finish = reply.finish
        check_calls(finish, {named(number)} if choice == "function" else {t.name for t in TOOLS})
        if choice == "none":
            assert not finish.tool_calls and finish.reason != "tool_calls"
        if choice in ("required", "function"):
            assert finish.tool_calls and finish.text == "", finish  # nothing but calls
        if number % 2:  # parallel_tool_calls false
            assert len(finish.tool_calls) <= 1, finish
        if finish.tool_calls and finish.reason != "length":
            assert finish.reason == "tool_calls" and not finish.incomplete, finish


def test_streamed_pieces_rebuild_the_calls_and_the_content(batch):
    _, replies = batch
    for number in range(len(PROMPTS)):
        reply = replies[(number, True)]
        finish = reply.finish
        assert reply.streamed_calls() == [{"id": c.id, "name": c.name, "arguments": c.arguments}
                                          for c in finish.tool_calls]
        assert reply.streamed_content() == finish.text


def test_not_streamed_gives_the_same_calls(batch):
    _, replies = batch
    for number in range(REPEATED):
        streamed, whole = replies[(number, True)].finish, replies[(number, False)].finish
        assert [(c.name, c.arguments) for c in whole.tool_calls] == [(c.name, c.arguments)
                                                                     for c in streamed.tool_calls]
        assert (whole.text, whole.reason, whole.token_ids) == (streamed.text, streamed.reason, streamed.token_ids)
        ids = [c.id for c in whole.tool_calls + streamed.tool_calls]
        assert len(set(ids)) == len(ids)  # every call has its own id


def test_usage_is_counted_as_for_any_chat(batch):
    _, replies = batch
    for reply in replies.values():
        assert reply.done.prompt_tokens == reply.accepted.prompt_tokens == len(reply.accepted.prompt_ids)
        assert reply.done.completion_tokens == len(reply.finish.token_ids) > 0
