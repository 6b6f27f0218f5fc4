"""Tool calling on chat completions (OpenAI, Friendli, TGI's and SGLang's OpenAI-compatible chat).

The gateway checks the shapes and the schemas and hands the worker a `ToolSpec`; the worker renders the
tools into the prompt, generates calls under the grammar of their schemas and splits them from the
content (worker/tools/README.md). Here the calls are rendered as OpenAI writes them: `message.tool_calls`
and, streamed, `delta.tool_calls` pieces whose first one carries the id, the type and the name.
"""

from __future__ import annotations

import re

import jsonschema
import msgspec

from common.protocol import FunctionTool, ToolCall, ToolCallDelta, ToolSpec
from gateway.dialects import bounds
from gateway.serving.dialect import check

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
MODES = ("none", "auto", "required")
MAX_TOOLS = 128  # OpenAI's limit


def _function(tool, index: int) -> FunctionTool:
    where = f"tools[{index}]"
    check(isinstance(tool, dict), f"{where} must be an object", where)
    check(tool.get("type", "function") == "function", f"{where}.type must be 'function'", f"{where}.type")
    function = tool.get("function")
    check(isinstance(function, dict), f"{where}.function must be an object", f"{where}.function")
    name = function.get("name")
    check(isinstance(name, str) and NAME.fullmatch(name) is not None,
          f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-'", f"{where}.function.name")
    description = function.get("description")
    check(description is None or isinstance(description, str), f"{where}.function.description must be a string",
          f"{where}.function.description")
    parameters = function.get("parameters")
    field = f"{where}.function.parameters"
    check(parameters is None or isinstance(parameters, dict), f"{field} must be a JSON schema object", field)
    if parameters is not None:
        bounds.grammar(_json(parameters), field, parameters)  # before the schema's own (slower) validation
        try:
            jsonschema.validators.validator_for(parameters).check_schema(parameters)
        except jsonschema.SchemaError as exc:
            where_in = "/".join(str(p) for p in exc.path)
            check(False, f"{field} is not a valid JSON schema{f' at {where_in}' if where_in else ''}: "
                         f"{exc.message}", field)
        check(parameters.get("type", "object") == "object", f"{field} must describe an object (type: object)", field)
    return FunctionTool(name=name, description=description, parameters=parameters)


def _choice(tool_choice, names: list[str]) -> tuple[str, str | None]:
    """(mode, forced function) of OpenAI's `tool_choice`; TGI also takes a function's name as a string."""
    if tool_choice is None:
        return "auto", None
    if isinstance(tool_choice, str):
        if tool_choice in MODES:
            return tool_choice, None
        check(tool_choice in names, "tool_choice must be none, auto, required, or name a function in tools",
              "tool_choice")
        return "function", tool_choice
    check(isinstance(tool_choice, dict), "tool_choice must be a string or an object", "tool_choice")
    function = tool_choice.get("function")
    check(tool_choice.get("type", "function") == "function" and isinstance(function, dict)
          and isinstance(function.get("name"), str),
          'tool_choice must be {"type": "function", "function": {"name": ...}}', "tool_choice")
    check(function["name"] in names, f"tool_choice names the function {function['name']!r}, which is not in tools",
          "tool_choice")
    return "function", function["name"]


def _json(value) -> str:
    return msgspec.json.encode(value).decode()


def tool_spec(tools, tool_choice, parallel_tool_calls: bool | None, tool_prompt: str | None) -> ToolSpec | None:
    """The worker's ToolSpec of a chat body's tool fields (None when the body has no tools)."""
    check(tool_prompt is None or isinstance(tool_prompt, str), "tool_prompt must be a string", "tool_prompt")
    if tools is None or tools == []:
        check(tool_choice in (None, "none", "auto"), "tool_choice needs tools", "tool_choice")
        check(parallel_tool_calls is None, "parallel_tool_calls needs tools", "parallel_tool_calls")
        return None
    check(isinstance(tools, list), "tools must be a list", "tools")
    check(len(tools) <= MAX_TOOLS, f"tools may hold at most {MAX_TOOLS} functions", "tools")
    functions = [_function(tool, index) for index, tool in enumerate(tools)]
    schemas = [function.parameters for function in functions if function.parameters is not None]
    bounds.grammar(_json(schemas), "tools", schemas)  # the worker compiles them into one grammar
    names: list[str] = []
    for index, function in enumerate(functions):
        check(function.name not in names, f"tools[{index}].function.name: {function.name!r} is used twice",
              f"tools[{index}].function.name")
        names.append(function.name)
    mode, forced = _choice(tool_choice, names)
    # a forced function is called once unless parallel calls are asked for (as vLLM and TGI do): a framework runs
    # every call it gets, so repeats would run the tool twice and bill the tokens of each
    parallel = mode != "function" if parallel_tool_calls is None else parallel_tool_calls
    return ToolSpec(functions=functions, choice=mode, function=forced, parallel_calls=parallel, prompt=tool_prompt)


def history_calls(calls, index: int) -> list[dict]:
    """An assistant turn's `tool_calls`, checked, in the shape the worker reads."""
    where = f"messages[{index}].tool_calls"
    check(isinstance(calls, list), f"{where} must be a list", "messages")
    result = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        check(isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"],
              f"{where}[{number}] needs function.name", "messages")
        arguments = function.get("arguments", "{}")
        check(isinstance(arguments, (str, dict)), f"{where}[{number}].function.arguments must be JSON text",
              "messages")
        call_id = call.get("id")
        check(call_id is None or isinstance(call_id, str), f"{where}[{number}].id must be a string", "messages")
        result.append({"id": call_id or f"call_{index}_{number}", "type": "function",
                       "function": {"name": function["name"], "arguments": arguments}})
    return result


def message_calls(calls: list[ToolCall]) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def delta_call(delta: ToolCallDelta) -> dict:
    """One streamed piece: the first of a call names it (OpenAI sends id, type and name once)."""
    piece: dict = {"index": delta.call}
    if delta.id is not None:
        piece.update(id=delta.id, type="function", function={"name": delta.name, "arguments": delta.arguments})
    else:
        piece["function"] = {"arguments": delta.arguments}
    return piece
