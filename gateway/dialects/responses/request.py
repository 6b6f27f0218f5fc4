"""OpenAI's Responses API request (`POST /v1/responses`): the body, its checks (OpenAI's 400 naming `param`,
unknown keys refused), and its `input` items as the worker's chat turns: messages with text parts, a
`function_call` as an assistant turn's tool call, a `function_call_output` as a tool turn. Function tools and
`text.format` map onto chat's tool spec and structured-output constraint; OpenAI's hosted tools are refused."""

from __future__ import annotations

import msgspec

from common.protocol import Constraint, ToolSpec
from gateway.dialects import bounds
from gateway.dialects.openai.family import OPENAI_TOLERATED
from gateway.dialects.openai.request import constraint
from gateway.dialects.openai.tools import tool_spec
from gateway.errors import BadRequest
from gateway.serving.dialect import check, fail, required

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text", "text")
TOLERATED = OPENAI_TOLERATED | {"truncation", "include", "user", "reasoning", "background"}


class ResponsesBody(msgspec.Struct, kw_only=True):
    model: str | None = None
    input: str | list | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    text: dict | None = None
    stream: bool | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict | None = None


def _content(content, where: str) -> str:
    if isinstance(content, str):
        return content
    check(isinstance(content, list), f"{where} must be a string or a list of text parts", "input")
    bounds.at_most(content, bounds.MAX_MESSAGES, "input", "parts")
    texts = []
    for part in content:
        if not (isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str)):
            fail(f"{where}: only text parts (input_text, output_text) are supported by this model", "input")
        texts.append(part["text"])
    return "".join(texts)


def input_turns(value) -> list[dict]:
    """`input` (a string, or a list of items) as chat turns; consecutive function calls join one assistant turn."""
    required(value is not None, "input")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    check(isinstance(value, list) and len(value) > 0, "input must be a string or a non-empty list of items", "input")
    bounds.at_most(value, bounds.MAX_MESSAGES, "input", "items")
    turns: list[dict] = []
    for index, item in enumerate(value):
        where = f"input[{index}]"
        check(isinstance(item, dict), f"{where} must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = ROLES.get(item.get("role"))
            if role is None:
                fail(f"{where}.role must be one of user, system, developer, assistant", "input")
            turns.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                if not (isinstance(item.get(key), str) and (item[key] or key == "arguments")):
                    fail(f"{where}.{key} must be a string", "input")
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            if turns and turns[-1]["role"] == "assistant" and turns[-1].get("tool_calls"):
                turns[-1]["tool_calls"].append(call)
            else:
                turns.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            check(isinstance(item.get("call_id"), str) and item["call_id"] != "",
                  f"{where}.call_id must name the call it answers", "input")
            output = item.get("output")
            text = output if isinstance(output, str) else _content(output, f"{where}.output")
            turns.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        else:
            fail(f"{where}: input items of type {kind!r} are not supported by this model", "input")
    return turns


def tools(body: ResponsesBody, model: str) -> ToolSpec | None:
    """Function tools (`{"type": "function", "name", "description", "parameters", "strict"}`) as chat's tool
    spec; a hosted tool (web search, file search, computer use...) is refused, as OpenAI refuses a tool its
    model does not support."""
    if body.tools is not None:
        check(isinstance(body.tools, list), "tools must be a list", "tools")
        for tool in body.tools:
            kind = tool.get("type") if isinstance(tool, dict) else None
            if kind != "function":
                raise BadRequest(f"Hosted tool '{kind}' is not supported with {model}.", param="tools",
                                 code="unsupported_tool")
    functions = [{"type": "function", "function": {key: tool.get(key) for key in ("name", "description", "parameters")
                                                   if tool.get(key) is not None}} for tool in body.tools or []]
    choice = body.tool_choice
    if isinstance(choice, dict):
        check(choice.get("type") == "function" and isinstance(choice.get("name"), str),
              'tool_choice must be "none", "auto", "required" or {"type": "function", "name": ...}', "tool_choice")
        choice = {"type": "function", "function": {"name": choice["name"]}}
    return tool_spec(functions or None, choice, body.parallel_tool_calls, None)


def text_format(text: dict | None) -> tuple[dict, Constraint | None]:
    """`text.format` (text, json_object, json_schema {name, schema, strict}) -> (as echoed, the constraint)."""
    check(text is None or isinstance(text, dict), "text must be an object", "text")
    chosen = (text or {}).get("format") or {"type": "text"}
    check(isinstance(chosen, dict), "text.format must be an object", "text.format")
    kind = chosen.get("type")
    if kind == "json_schema":
        check(isinstance(chosen.get("schema"), dict), "text.format.schema must be a JSON schema object",
              "text.format.schema")
        return chosen, constraint({"type": "json_schema", "json_schema": {"schema": chosen["schema"]}})
    check(kind in ("text", "json_object"), "text.format.type must be text, json_object or json_schema",
          "text.format.type")
    return chosen, constraint({"type": kind})
