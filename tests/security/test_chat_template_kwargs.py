"""`chat_template_kwargs` (issue #49 item 5) put client values into the worker's chat template: every layer bounds
them, so a request that skips the gateway is refused by the worker too. The protocol decodes at most 16 variables
with plain names and scalar values (strings up to 1,024 characters); the worker's renderer refuses a name it sets
itself (messages, tools, add_generation_prompt, ...), which would otherwise override the conversation or the
template. The gateway's refusal through a real client: tests/compat/test_prefill_and_formats.py."""

from __future__ import annotations

import copy

import msgspec
import pytest

from common.protocol import RESERVED_TEMPLATE_KWARGS, GenerateRequest, TokenizeRequest
from worker.tools.errors import ToolError
from worker.tools.prompt import render_chat

HI = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("kwargs", [
    {f"k{i}": 1 for i in range(17)}, {"bad name": 1}, {"x": [1]}, {"x": {"y": 1}}, {"x": "y" * 1025}, {"": 1},
    {"__class__": 1, **{f"k{i}": 1 for i in range(16)}},
])
@pytest.mark.parametrize("kind", [GenerateRequest, TokenizeRequest])
def test_the_worker_protocol_refuses_what_the_gateway_refuses(kwargs, kind):
    body = msgspec.json.encode({"request_id": "r", "model": "m", "chat_template_kwargs": kwargs})
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(body, type=kind)


@pytest.mark.parametrize("name", sorted(RESERVED_TEMPLATE_KWARGS))
def test_the_worker_never_lets_a_client_set_its_own_arguments(smol_tokenizer, name):
    with pytest.raises(ToolError) as refused:
        render_chat(smol_tokenizer, HI, None, True, template_kwargs={name: True})
    assert refused.value.field == "chat_template_kwargs"


def test_allowed_variables_reach_the_template(smol_tokenizer):
    twin = copy.deepcopy(smol_tokenizer)
    twin.chat_template = "{{ greeting }}{% for m in messages %}[{{ m.content }}]{% endfor %}"
    assert render_chat(twin, HI, None, True, template_kwargs={"greeting": "hello"}) == "hello[Hi]"
