"""What a chat body may ask of the chat template beyond its messages, checked as the worker will check it:
`chat_template_kwargs` (vLLM's and SGLang's extra template variables) and a prefill (a final assistant message
the model continues: Anthropic's prefill, vLLM's `continue_final_message`)."""

from __future__ import annotations

import msgspec

from common.protocol import RESERVED_TEMPLATE_KWARGS, TemplateKwargs
from gateway.serving.dialect import check, fail

PARAM = "chat_template_kwargs"


def template_kwargs(value) -> dict:
    """At most MAX_TEMPLATE_KWARGS names (letters, digits, `_`) of scalar values (strings up to 1,024 characters),
    none that the server sets itself (common/protocol.py)."""
    if value is None:
        return {}
    try:
        kwargs = msgspec.convert(value, TemplateKwargs)
    except msgspec.ValidationError as exc:
        fail(f"{PARAM}: at most 16 variables, named with letters, digits and '_', each a string, number, boolean or "
             f"null ({exc})", PARAM)
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    check(not reserved, f"{PARAM} may not set {reserved[0]!r}: the server sets it" if reserved else "", PARAM)
    return kwargs


def final_text(turns: list[dict]) -> str | None:
    """The text of a final assistant turn that can be continued (no tool calls), else None."""
    final = turns[-1] if turns else None
    if final is None or final.get("role") != "assistant" or final.get("tool_calls"):
        return None
    return final.get("content") or ""
