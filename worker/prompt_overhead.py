"""What the chat template adds to a prompt, in UTF-8 bytes, for the gateway's reservation bound.

The gateway reserves tokens before admission without a tokenizer: a byte-level BPE token (SmolLM2's, GPT-2's,
Llama 3's) is at least one byte, so the bytes of the rendered prompt bound its tokens. The client's own text
(messages and tool definitions, as JSON: common/prompt_size.py) the gateway counts itself; what the template
adds beyond it (framing per message, a default system prompt, the tool prompt and call format) is measured
here once, by rendering probe chats with empty contents, and published in `/info`
(`ModelInfo.prompt_overhead`). It holds for templates that render each message's strings once, as they are.
"""

from __future__ import annotations

import itertools

from common.prompt_size import function_bytes, message_bytes
from common.protocol import FunctionTool, PromptOverhead, ToolSpec
from worker.tools import render_chat

ROLES = ("system", "user", "assistant", "tool")
PROBES = tuple(FunctionTool(name=name, description="d",
                            parameters={"type": "object", "properties": {"a": {"type": kind}}})
               for name, kind in (("f", "string"), ("g", "integer")))


def measure(tokenizer) -> PromptOverhead:
    def size(messages: list[dict], tools: ToolSpec | None = None) -> int:
        try:
            return len(render_chat(tokenizer, messages, tools, True).encode())
        except Exception:  # a template that refuses this role order: it never renders it for a client either
            return 0

    def empty(role: str) -> dict:
        return {"role": role, "content": ""}

    # the gateway counts each message's JSON, which holds its role and content: what the template adds
    # beyond that JSON is the overhead (none, when the JSON's keys and quotes outweigh the framing)
    one = max(size([empty(role)]) - message_bytes(empty(role)) for role in ROLES)
    further = max(size([empty(a), empty(b)]) - size([empty(a)]) - message_bytes(empty(b))
                  for a, b in itertools.product(ROLES, repeat=2))
    user = [empty("user")]
    plain = size(user)
    first, both = list(PROBES[:1]), list(PROBES)
    # the default tool prompt, or the request's own (counted by the gateway) after a separator
    with_tools = max(size(user, ToolSpec(functions=first)), size(user, ToolSpec(functions=first, prompt="x")) - 1)
    tools = max(with_tools - plain - function_bytes(PROBES[0]), 0)
    second = size(user, ToolSpec(functions=both)) - size(user, ToolSpec(functions=first))
    per_tool = max(second - function_bytes(PROBES[1]), 0)
    return PromptOverhead(fixed=max(one, 0), per_message=max(further, 0), tools=tools, per_tool=per_tool,
                          text=len(tokenizer("").input_ids) + 1)  # + a SentencePiece-style dummy prefix
