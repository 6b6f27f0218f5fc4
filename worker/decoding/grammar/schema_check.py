"""Checks on a JSON schema before it is compiled: is it a schema, and can the engine enforce all of it?

xgrammar compiles some keywords without enforcing them (measured: `not`, `if`/`then`/`else`,
`uniqueItems`, multi-branch `allOf`, remote `$ref`). An output built from such a schema could be
invalid, so those are refused with a message that names the keyword and where it is.
"""

from __future__ import annotations

import json

import jsonschema

# keyword -> why we refuse it
UNSUPPORTED = {
    "not": "'not' is not supported",
    "if": "'if'/'then'/'else' is not supported",
    "then": "'if'/'then'/'else' is not supported",
    "else": "'if'/'then'/'else' is not supported",
    "dependentSchemas": "'dependentSchemas' is not supported",
}
# keywords whose value maps names to subschemas (the names themselves are not keywords)
_SCHEMA_MAPS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")


class SchemaError(ValueError):
    pass


def parse_schema(text: str) -> dict | bool:
    """The schema as a Python value; SchemaError when it is not JSON or not a valid JSON schema."""
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SchemaError(f"the JSON schema is not valid JSON: {exc}") from exc
    if not isinstance(schema, (dict, bool)):
        raise SchemaError(f"a JSON schema must be an object, got {type(schema).__name__}")
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the top level"
        raise SchemaError(f"invalid JSON schema at {where}: {exc.message}") from exc
    _check_supported(schema, "#")
    return schema


def _check_supported(node, where: str) -> None:
    if isinstance(node, list):
        for i, item in enumerate(node):
            _check_supported(item, f"{where}/{i}")
        return
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        here = f"{where}/{key}"
        if key in UNSUPPORTED:
            raise SchemaError(f"unsupported schema feature at {here}: {UNSUPPORTED[key]}")
        if key == "uniqueItems" and value is True:
            raise SchemaError(f"unsupported schema feature at {here}: 'uniqueItems' is not supported")
        if key == "allOf" and isinstance(value, list) and len(value) > 1:
            raise SchemaError(f"unsupported schema feature at {here}: 'allOf' with several schemas is not supported")
        if key == "$ref" and isinstance(value, str) and not value.startswith("#"):
            raise SchemaError(f"unsupported schema feature at {here}: only local references ('#/...') are supported")
        if key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                _check_supported(sub, f"{here}/{name}")
        elif key not in ("enum", "const", "default", "examples", "required"):
            _check_supported(value, here)
