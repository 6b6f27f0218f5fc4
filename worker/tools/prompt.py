"""Render a chat with tools into the prompt text.

A chat template that reads the `tools` variable renders the tools itself (transformers'
`apply_chat_template(tools=...)`), and earlier tool turns pass through to it. Otherwise, as TGI does,
the tool prompt (TGI's default text when the request has none), the tool definitions as JSON and the
call format are appended to the last message, and earlier calls are written into the assistant
turns in the call syntax the model is asked to use, so the history reads as the model's own output.
"""

from __future__ import annotations

import functools
import json

import jinja2
import jinja2.meta

from common.protocol import RESERVED_TEMPLATE_KWARGS, FunctionTool, ToolSpec
from worker.tools.errors import ToolError
from worker.tools.syntax import JSON_CALLS, CallSyntax, syntax_of

# TGI's default `tool_prompt` (the seed's openapi.json shows it as the example)
DEFAULT_TOOL_PROMPT = (
    "\nYou will be presented with a JSON schema representing a set of tools.\nIf the user request lacks of "
    "sufficient information to make a precise tool selection: Do not invent any tool's properties, instead "
    "notify with an error message.\n\nJSON Schema:\n"
)
SEPARATOR = "\n---\n"  # between the last message and the tool text, as TGI writes it


def offered(spec: ToolSpec | None) -> list[FunctionTool]:
    """The functions shown to the model: none for tool_choice "none", only the forced one when named."""
    if spec is None or spec.choice == "none":
        return []
    if spec.choice == "function":
        return [f for f in spec.functions if f.name == spec.function]
    return list(spec.functions)


def definitions(functions: list[FunctionTool]) -> list[dict]:
    """Functions in the OpenAI `tools` shape that chat templates expect."""
    result = []
    for function in functions:
        body: dict = {"name": function.name}
        if function.description:
            body["description"] = function.description
        body["parameters"] = function.parameters if function.parameters is not None else {"type": "object",
                                                                                          "properties": {}}
        result.append({"type": "function", "function": body})
    return result


@functools.lru_cache(maxsize=64)
def reads_tools(template: str) -> bool:
    """Whether a chat template uses the `tools` variable (TGI's test, on the template's free variables)."""
    try:
        return "tools" in jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(template))
    except jinja2.TemplateSyntaxError:
        return False


def chat_template(tokenizer, functions: list[FunctionTool]) -> tuple[str | None, bool]:
    """The template transformers would use for this request, and whether it renders tools itself."""
    try:
        template = tokenizer.get_chat_template(tools=definitions(functions) or None)
    except ValueError:  # no chat template: apply_chat_template reports it
        return None, False
    return template, reads_tools(template)


def call_syntax(tokenizer, spec: ToolSpec) -> CallSyntax:
    template, native = chat_template(tokenizer, offered(spec))
    return syntax_of(template) if native else JSON_CALLS


def call_format(syntax: CallSyntax) -> str:
    example = syntax.render("<tool name>", "{<arguments>}")
    return f"To call a tool, reply with {example}, one call per line."


def render_chat(tokenizer, messages: list[dict], spec: ToolSpec | None, add_generation_prompt: bool, *,
                continue_final: bool = False, template_kwargs: dict | None = None) -> str:
    """The prompt text. `continue_final`: the last (assistant) message is left open, to be continued (a prefill:
    transformers' continue_final_message); `template_kwargs`: extra template variables (chat_template_kwargs)."""
    check_template_kwargs(template_kwargs or {})
    if continue_final:
        _check_prefill(messages)
    functions = offered(spec)
    template, native = chat_template(tokenizer, functions)
    syntax = syntax_of(template) if native else JSON_CALLS
    turns = [_native_turn(m, i) if native else _text_turn(m, i, syntax) for i, m in enumerate(messages)]
    # the tool text closes the last turn the model answers: the user's, not a prefill that it continues
    last = len(turns) - 2 if continue_final else len(turns) - 1
    if functions and last >= 0:
        if not native:
            tool_text = (spec.prompt if spec.prompt is not None else DEFAULT_TOOL_PROMPT)
            tool_text += json.dumps(definitions(functions), separators=(",", ":")) + "\n" + call_format(syntax)
            turns[last] = {**turns[last], "content": _content(turns[last], last) + SEPARATOR + tool_text}
        elif spec.prompt:
            turns[last] = {**turns[last], "content": _content(turns[last], last) + SEPARATOR + spec.prompt}
    return tokenizer.apply_chat_template(turns, tools=definitions(functions) if native and functions else None,
                                         tokenize=False, add_generation_prompt=add_generation_prompt and not
                                         continue_final, continue_final_message=continue_final,
                                         **(template_kwargs or {}))


def check_template_kwargs(kwargs: dict) -> None:
    """The worker's own check of chat_template_kwargs (the protocol bounds their count, names and sizes): never an
    argument of apply_chat_template or a variable the worker sets itself."""
    reserved = sorted(RESERVED_TEMPLATE_KWARGS.intersection(kwargs))
    if reserved:
        raise ToolError(f"chat_template_kwargs may not set {reserved[0]!r}: the server sets it", "chat_template_kwargs")


def _check_prefill(messages: list[dict]) -> None:
    """A prefill is a final assistant message of text, which the model continues."""
    final = messages[-1] if messages else None
    if not (isinstance(final, dict) and final.get("role") == "assistant" and not final.get("tool_calls")):
        raise ToolError("continue_final_message needs a final assistant message (without tool calls) to continue",
                        "messages")
    if not _content(final, len(messages) - 1).strip():
        raise ToolError("continue_final_message needs a final assistant message with text to continue", "messages")


def _tool_calls(message: dict, index: int) -> list[tuple[str, object]]:
    """(name, arguments) of an assistant turn's tool calls; ToolError on a malformed entry."""
    calls = message.get("tool_calls") or []
    where = f"messages[{index}].tool_calls"
    if not isinstance(calls, list):
        raise ToolError(f"{where} must be a list", "messages")
    result = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not name:
            raise ToolError(f"{where}[{number}] needs function.name", "messages")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, (str, dict)):
            raise ToolError(f"{where}[{number}].function.arguments must be JSON text or an object", "messages")
        result.append((name, arguments))
    return result


def _content(message: dict, index: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ToolError(f"messages[{index}].content must be text", "messages")


def _text_turn(message: dict, index: int, syntax: CallSyntax) -> dict:
    """A turn for a template without tools: calls become the text the model would have written."""
    if not isinstance(message, dict):
        raise ToolError(f"messages[{index}] must be an object", "messages")
    calls = _tool_calls(message, index)
    if not calls and isinstance(message.get("content"), str):
        return message
    content = _content(message, index)
    written = [syntax.render(name, arguments if isinstance(arguments, str) else json.dumps(arguments))
               for name, arguments in calls]
    turn = {k: v for k, v in message.items() if k != "tool_calls"}
    turn["content"] = "\n".join(([content] if content else []) + written)
    return turn


def _native_turn(message: dict, index: int) -> dict:
    """A turn for a tools-aware template: call arguments as objects, which is what such templates expect."""
    if not isinstance(message, dict):
        raise ToolError(f"messages[{index}] must be an object", "messages")
    if not _tool_calls(message, index):
        return message
    calls = []
    for call in message["tool_calls"]:
        function = dict(call["function"])
        if isinstance(function.get("arguments"), str):
            try:
                function["arguments"] = json.loads(function["arguments"])
            except json.JSONDecodeError:
                pass  # left as text: the template renders what it was given
        calls.append({**call, "function": function})
    return {**message, "tool_calls": calls}
