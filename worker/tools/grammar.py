"""The grammar of a reply with tools, as one xgrammar structural tag.

Each callable function is a tag: its head (`{"name": "<name>", "arguments": `, in the call syntax) is
literal text, its content the grammar of the function's parameter schema (compact JSON, as for
json_schema constraints), its end the fixed tail. "required" and a named function allow only calls
(`tags_with_separator`, at least one); "auto" allows free text in which the trigger starts a call
(`triggered_tags`), or, with a structured-output constraint (response_format, text.format, an agent's
output_type), one of two answers (`or`): calls as "required" writes them, or content valid for the
constraint. Without parallel calls, generation ends after the first call.
"""

from __future__ import annotations

import functools
import json

from common.protocol import Constraint, FunctionTool, ToolSpec
from worker.decoding.grammar.compiler import _clean
from worker.decoding.grammar.schema_check import SchemaError, parse_schema
from worker.tools.errors import ToolError
from worker.tools.syntax import CallSyntax

NO_PARAMETERS = {"type": "object", "properties": {}}  # OpenAI: no `parameters` means an empty list


@functools.lru_cache(maxsize=512)
def _arguments_grammar(schema_text: str) -> str:
    """EBNF of one parameters schema; SchemaError or RuntimeError (xgrammar) when it cannot be enforced."""
    import xgrammar as xgr

    schema = json.dumps(parse_schema(schema_text))
    try:  # strict closes unlisted properties, as compiler.py does for json_schema constraints
        grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True)
    except RuntimeError:  # some valid schemas contradict strict closing (e.g. minItems without items)
        grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=False)
    return str(grammar)


def arguments_grammar(function: FunctionTool, index: int) -> str:
    """The EBNF of `function`'s arguments; ToolError naming tools[index] when its schema cannot be enforced."""
    parameters = NO_PARAMETERS if function.parameters is None else function.parameters
    field = f"tools[{index}].function.parameters"
    try:
        return _arguments_grammar(json.dumps(parameters))
    except SchemaError as exc:
        raise ToolError(f"{field}: {exc}", field) from None
    except RuntimeError as exc:
        raise ToolError(f"{field}: invalid JSON schema: {_clean(exc)}", field) from None


@functools.lru_cache(maxsize=128)
def _answer_grammar(kind: str, value: str) -> str:
    import xgrammar as xgr

    if kind == "json_schema":
        return _arguments_grammar(value)
    if kind == "json_object":  # any JSON object, compact, as compile_process.py builds it
        return str(xgr.Grammar.from_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False))
    if kind == "regex":
        return str(xgr.Grammar.from_regex(value))
    if kind == "ebnf":
        return str(xgr.Grammar.from_ebnf(value))
    raise RuntimeError(f"a {kind} constraint cannot be combined with tools")


def answer_grammar(constraint: Constraint, field: str) -> str:
    """The EBNF of the structured-output constraint that a reply without calls must satisfy; ToolError naming
    `field` when it cannot be built."""
    try:
        return _answer_grammar(constraint.kind, constraint.value)
    except SchemaError as exc:
        raise ToolError(f"{field}: {exc}", field) from None
    except RuntimeError as exc:
        raise ToolError(f"{field}: invalid {constraint.kind}: {_clean(exc)}", field) from None


def tools_constraint(spec: ToolSpec, syntax: CallSyntax, grammars: dict[str, str], answer: str | None = None
                     ) -> Constraint:
    """The structural tag for `spec` over the callable functions' argument grammars (name -> EBNF); `answer`: the
    EBNF that the content of a reply without calls must match (a structured-output constraint)."""
    tags = [{"type": "tag", "begin": syntax.head(name), "content": {"type": "grammar", "grammar": grammar},
             "end": syntax.tail} for name, grammar in grammars.items()]
    calls = {"type": "tags_with_separator", "tags": tags, "separator": syntax.separator, "at_least_one": True,
             "stop_after_first": not spec.parallel_calls}
    if spec.choice != "auto":
        form = calls
    elif answer is not None:  # tool calls, or the structured answer: never free text
        form = {"type": "or", "elements": [calls, {"type": "grammar", "grammar": answer}]}
    else:
        form = {"type": "triggered_tags", "triggers": [syntax.trigger], "tags": tags,
                "stop_after_first": not spec.parallel_calls}
    return Constraint("structural_tag", json.dumps({"type": "structural_tag", "format": form}))
