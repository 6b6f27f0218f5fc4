"""Anthropic's Messages API request (`POST /v1/messages`, `/v1/messages/count_tokens`): the body, its checks as
Anthropic makes them (400 naming the field, unknown keys refused), and its conversation as the worker's chat
messages: `system` first, `tool_use` blocks as an assistant turn's tool calls, `tool_result` blocks as tool turns
(before the user's text, as Anthropic requires them first in their message)."""

from __future__ import annotations

import msgspec

from common.protocol import Constraint, ToolSpec
from gateway.dialects import bounds
from gateway.dialects.chat_template import final_text
from gateway.dialects.openai.request import constraint
from gateway.dialects.openai.tools import tool_spec
from gateway.serving.dialect import check, fail, required

# Anthropic parameters that change nothing here: accepted and ignored
TOLERATED = frozenset({"metadata", "service_tier", "container", "mcp_servers"})
MAX_STOP_SEQUENCES = bounds.MAX_STOPS


class CountTokensBody(msgspec.Struct, kw_only=True):
    """What `count_tokens` reads: the conversation and its tools."""

    model: str | None = None
    messages: list | None = None
    system: str | list | None = None
    tools: list | None = None
    tool_choice: dict | None = None
    thinking: dict | None = None
    output_config: dict | None = None  # {"format": {"type": "json_schema", "schema"}, "effort"}: structured outputs


class MessagesBody(CountTokensBody, kw_only=True):
    max_tokens: int | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool | None = None
    metadata: dict | None = None
    service_tier: str | None = None


def _text(content, where: str) -> str:
    """A string, or a list of `{"type": "text", "text"}` blocks (a system prompt, a tool result)."""
    if isinstance(content, str):
        return content
    check(isinstance(content, list), f"{where} must be a string or a list of text blocks", where)
    bounds.at_most(content, bounds.MAX_MESSAGES, where, "blocks")
    texts = []
    for block in content:
        if not (isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)):
            fail(f"{where}: only text blocks are supported here", where)
        texts.append(block["text"])
    return "".join(texts)


def _call(block: dict, where: str) -> dict:
    """A `tool_use` block as the tool call of an assistant turn (OpenAI's shape, which the worker reads)."""
    check(isinstance(block.get("id"), str) and block["id"] != "", f"{where}.id must be a non-empty string", where)
    check(isinstance(block.get("name"), str) and block["name"] != "", f"{where}.name must be a non-empty string",
          where)
    check(isinstance(block.get("input"), dict), f"{where}.input must be an object", where)
    return {"id": block["id"], "type": "function",
            "function": {"name": block["name"], "arguments": msgspec.json.encode(block["input"]).decode()}}


def _turns(role: str, content, index: int) -> list[dict]:
    where = f"messages.{index}.content"
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    check(isinstance(content, list) and len(content) > 0, f"{where} must be a string or a non-empty list of blocks",
          where)
    bounds.at_most(content, bounds.MAX_MESSAGES, where, "blocks")
    texts, calls, results = [], [], []
    for number, block in enumerate(content):
        at = f"{where}.{number}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            calls.append(_call(block, at))
        elif kind == "tool_result" and role == "user":
            check(isinstance(block.get("tool_use_id"), str) and block["tool_use_id"] != "",
                  f"{at}.tool_use_id must be a non-empty string", at)
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _text(block.get("content") or "", f"{at}.content")})
        else:
            fail(f"{at}: a {role} message takes text{', tool_use' if role == 'assistant' else ', tool_result'} "
                 f"blocks; {kind!r} is not supported by this model", at)
    turns = results
    if calls:
        turns.append({"role": "assistant", "content": "".join(texts) or None, "tool_calls": calls})
    elif texts or not results:
        turns.append({"role": role, "content": "".join(texts)})
    return turns


def conversation(body: CountTokensBody) -> list[dict]:
    """`system` and `messages` as the worker's chat messages."""
    required(body.messages is not None, "messages")
    check(isinstance(body.messages, list) and len(body.messages) > 0, "messages: at least one message is required",
          "messages")
    bounds.at_most(body.messages, bounds.MAX_MESSAGES, "messages", "messages")
    check(body.thinking is None or body.thinking.get("type") == "disabled",
          "thinking: extended thinking is not supported by this model", "thinking")
    turns = [] if body.system is None else [{"role": "system", "content": _text(body.system, "system")}]
    for index, message in enumerate(body.messages):
        if not (isinstance(message, dict) and message.get("role") in ("user", "assistant")):
            fail(f"messages.{index}.role must be user or assistant", f"messages.{index}.role")
        turns += _turns(message["role"], message.get("content"), index)
    return turns


def tools(body: CountTokensBody) -> ToolSpec | None:
    """Anthropic's `tools` ({name, description, input_schema}) and `tool_choice` ({"type": auto | any | tool |
    none, "name", "disable_parallel_tool_use"}) as the worker's ToolSpec."""
    if body.tools is None:
        check(body.tool_choice is None, "tool_choice: needs tools", "tool_choice")
        return None
    check(isinstance(body.tools, list), "tools must be a list", "tools")
    functions = []
    for index, tool in enumerate(body.tools):
        if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
            fail(f"tools.{index}: only custom tools ({{name, description, input_schema}}) are supported",
                 f"tools.{index}")
        check(isinstance(tool.get("input_schema"), dict), f"tools.{index}.input_schema must be a JSON schema object",
              f"tools.{index}.input_schema")
        functions.append({"type": "function", "function": {"name": tool.get("name"), "parameters": tool["input_schema"],
                                                          "description": tool.get("description")}})
    choice = body.tool_choice or {"type": "auto"}
    check(isinstance(choice, dict) and choice.get("type") in ("auto", "any", "tool", "none"),
          "tool_choice.type must be auto, any, tool or none", "tool_choice")
    openai_choice = {"auto": "auto", "any": "required", "none": "none"}.get(choice["type"]) or {
        "type": "function", "function": {"name": choice.get("name")}}
    parallel = False if choice.get("disable_parallel_tool_use") else None
    return tool_spec(functions, openai_choice, parallel, None)


EFFORTS = ("low", "medium", "high", "xhigh", "max")  # accepted; this model has one effort


def output_format(body: CountTokensBody) -> Constraint | None:
    """`output_config.format` ({"type": "json_schema", "schema"}, what `messages.parse(output_format=...)` sends) as
    the structured-output constraint: the text block is then JSON valid for the schema."""
    config = body.output_config
    if config is None:
        return None
    check(isinstance(config, dict), "output_config: must be an object", "output_config")
    for key in config:
        check(key in ("format", "effort"), f"output_config.{key}: Extra inputs are not permitted",
              f"output_config.{key}")
    check(config.get("effort") in (None, *EFFORTS), f"output_config.effort: must be one of {', '.join(EFFORTS)}",
          "output_config.effort")
    chosen = config.get("format")
    if chosen is None:
        return None
    check(isinstance(chosen, dict) and chosen.get("type") == "json_schema",
          "output_config.format.type: must be json_schema", "output_config.format")
    check(isinstance(chosen.get("schema"), dict), "output_config.format.schema: must be a JSON schema object",
          "output_config.format.schema")
    return constraint({"type": "json_schema", "json_schema": {"schema": chosen["schema"]}})


def prefill(turns: list[dict]) -> bool:
    """Whether the conversation ends in an assistant prefill, which the model continues (as Anthropic does). An empty
    final assistant message is dropped (a plain new turn); trailing whitespace is refused, as Anthropic refuses it."""
    text = final_text(turns)
    if text is None:
        return False
    if not text:
        turns.pop()
        return False
    check(text == text.rstrip(), "messages: final assistant content cannot end with trailing whitespace",
          f"messages.{len(turns) - 1}.content")
    return True
