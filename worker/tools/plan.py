"""What the worker makes of a request's tools: checks, the call syntax, the compiled grammar, the parsers."""

from __future__ import annotations

import re
from dataclasses import dataclass

from common.protocol import GenerateRequest
from worker.decoding.grammar import GrammarBusy, GrammarError
from worker.tools.calls import CallParser
from worker.tools.errors import ToolError
from worker.tools.grammar import answer_grammar, arguments_grammar, tools_constraint
from worker.tools.prompt import call_syntax, offered
from worker.tools.syntax import CallSyntax

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule; it also keeps names literal inside the call syntax


@dataclass(frozen=True)
class ToolPlan:
    syntax: CallSyntax
    names: tuple[str, ...]  # the functions the model may call
    calls_only: bool  # no content: required or a named function
    grammar: object  # worker.decoding.grammar.Grammar
    exclusive: bool = False  # calls or content valid for a constraint, never both (auto with a constraint)

    def parser(self, choice: int) -> CallParser:
        return CallParser(self.syntax, self.names, choice, self.calls_only, exclusive=self.exclusive)


def check_tools(request: GenerateRequest) -> None:
    """Rules that need no tokenizer; ToolError names the field."""
    spec = request.tools
    if spec is None:
        return
    if request.messages is None:
        raise ToolError("tools need a chat (messages)", "tools")
    if not spec.functions and spec.choice != "none":
        raise ToolError("tools must name at least one function", "tools")
    seen: set[str] = set()
    for index, function in enumerate(spec.functions):
        field = f"tools[{index}].function.name"
        if not NAME.fullmatch(function.name):
            raise ToolError(f"{field} must be 1 to 64 letters, digits, '_' or '-'", field)
        if function.name in seen:
            raise ToolError(f"{field}: the function name {function.name!r} is used twice", field)
        seen.add(function.name)
    if spec.choice == "function" and spec.function is None:
        raise ToolError("tool_choice 'function' needs the function's name", "tool_choice")
    if spec.choice == "function" and spec.function not in seen:
        raise ToolError(f"tool_choice names the function {spec.function!r}, which is not in tools", "tool_choice")


def plan_tools(request: GenerateRequest, tokenizer, min_new: int, compile_grammar) -> ToolPlan | None:
    """The plan for a request with tools (None when the model may not call any); ToolError names the field."""
    spec = request.tools
    if spec is None:
        return None
    grammars = {f.name: arguments_grammar(f, i) for i, f in enumerate(spec.functions)}  # every schema is checked
    callable_names = [f.name for f in offered(spec)]
    if not callable_names:
        return None
    params = request.params
    # with "auto" the reply is calls or content valid for the constraint; "required" and a named function
    # allow calls only, so the constraint is for a later turn's answer (as OpenAI applies it)
    answer = None
    if params.constraint is not None and spec.choice == "auto":
        answer = answer_grammar(params.constraint, "response_format")
    if params.num_beams > 1:
        raise ToolError("tools cannot be combined with beam search (num_beams > 1)", "tools")
    if min_new > 0:
        raise ToolError("min_tokens cannot be combined with tools: the grammar decides where the output ends",
                        "min_tokens")
    syntax = call_syntax(tokenizer, spec)
    constraint = tools_constraint(spec, syntax, {name: grammars[name] for name in callable_names}, answer)
    try:
        grammar = compile_grammar(constraint)
    except GrammarBusy:
        raise  # not the request's fault: prepare tells the client to retry
    except GrammarError as exc:
        raise ToolError(f"cannot build the grammar of the tools: {exc}", "tools") from None
    return ToolPlan(syntax, tuple(callable_names), spec.choice != "auto", grammar, exclusive=answer is not None)
