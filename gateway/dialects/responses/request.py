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
TOLERATED = OPENAI_TOLERATED | {"truncation", "user", "reasoning", "background"}
LOGPROBS = "message.output_text.logprobs"
# OpenAI's `include` values: the logprobs apply; the others name outputs of hosted tools and inputs this model
# never has (refused where they would be asked for), so there is nothing of theirs to include
INCLUDABLE = frozenset({LOGPROBS, "reasoning.encrypted_content", "file_search_call.results", "web_search_call.results",
                        "web_search_call.action.sources", "message.input_image.image_url",
                        "computer_call_output.output.image_url", "code_interpreter_call.outputs"})
MAX_TOP_LOGPROBS = 20
MAX_TOOL_CALLS = 128  # as many calls as tools may be offered (gateway/dialects/openai/tools.py)


class CountBody(msgspec.Struct, kw_only=True):
    """What `POST /v1/responses/input_tokens` reads: the input a response would be prompted with."""

    model: str | None = None
    input: str | list | None = None
    instructions: str | None = None
    tools: list | None = None
    tool_choice: str | dict | None = None
    parallel_tool_calls: bool | None = None
    text: dict | None = None
    previous_response_id: str | None = None


class ResponsesBody(CountBody, kw_only=True):
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    stream_options: dict | None = None  # {"include_obfuscation"}: this server never pads its events
    include: list[str] | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    store: bool | None = None
    metadata: dict | None = None
    # OpenAI's Predicted Outputs, as chat's (gateway/dialects/openai/prediction.py): OpenAI's Responses API has no
    # such field, but the edit-a-file requests it speeds up are made here too, and the rule is the same
    prediction: dict | None = None


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


def tools(body: CountBody, model: str) -> ToolSpec | None:
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
    parallel = body.parallel_tool_calls
    if getattr(body, "max_tool_calls", None) == 1 and functions:  # one call: the grammar ends there
        parallel = False
    return tool_spec(functions or None, choice, parallel, None)


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


def logprobs(body: ResponsesBody) -> int | None:
    """How many alternatives each output token's logprobs list (None: no logprobs): they are returned when `include`
    holds "message.output_text.logprobs", with `top_logprobs` (0-20) alternatives each."""
    check(body.include is None or len(body.include) <= len(INCLUDABLE), "include holds a value twice", "include")
    for value in body.include or []:
        check(value in INCLUDABLE, f"include: {value!r} is not one of {', '.join(sorted(INCLUDABLE))}", "include")
    top = body.top_logprobs
    check(top is None or 0 <= top <= MAX_TOP_LOGPROBS, f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}",
          "top_logprobs")
    return (top or 0) if LOGPROBS in (body.include or []) else None


def stream_options(body: ResponsesBody) -> None:
    options = body.stream_options
    if options is None:
        return
    check(isinstance(options, dict) and set(options) <= {"include_obfuscation"}
          and isinstance(options.get("include_obfuscation", False), bool),
          'stream_options must be {"include_obfuscation": true | false}', "stream_options")


def max_tool_calls(body: ResponsesBody) -> int | None:
    """The most calls one response makes (calls the model writes past it are dropped, as OpenAI ignores them)."""
    limit = body.max_tool_calls
    check(limit is None or 1 <= limit <= MAX_TOOL_CALLS, f"max_tool_calls must be between 1 and {MAX_TOOL_CALLS}",
          "max_tool_calls")
    return limit
