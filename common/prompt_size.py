"""The UTF-8 bytes of what a client puts into a chat prompt, counted the same way by the gateway (its
reservation bound, gateway/limits/tokens.py) and the worker (the template's overhead beside it,
worker/prompt_overhead.py).

A message counts as its JSON: every string a template may render (role, content, name, tool calls) plus
punctuation, which more than covers the template's own framing of those fields. A tool counts as its JSON
with non-ASCII escaped, as the tool prompt writes definitions (`json.dumps`), the larger form either way.
"""

from __future__ import annotations

import json

import msgspec

from common.protocol import FunctionTool


def message_bytes(message: object) -> int:
    return len(msgspec.json.encode(message))


def function_bytes(function: FunctionTool) -> int:
    return len(json.dumps(msgspec.to_builtins(function)))
