"""TGI's own openapi.json (embedded in the seed text /work/shared/seeds/002_*.txt) as a jsonschema validator.

The seed is a git page: commit message, then the JSON document. OpenAPI 3.0's `nullable: true` is
turned into JSON Schema's `anyOf [.., null]` so that `jsonschema` can check our replies against it.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import jsonschema

SEEDS = Path("/work/shared/seeds")


@functools.cache
def tgi_openapi() -> dict:
    seed = next(SEEDS.glob("002_*.txt")).read_text()
    start = seed.rfind("{", 0, seed.index('"openapi"'))
    document, _ = json.JSONDecoder().raw_decode(seed[start:])
    return document


def _nullable(node):
    if isinstance(node, list):
        return [_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _nullable(value) for key, value in node.items() if key not in ("example", "default")}
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


@functools.cache
def _components() -> dict:
    return {"components": {"schemas": _nullable(tgi_openapi()["components"]["schemas"])}}


def assert_tgi_schema(instance, name: str) -> None:
    """Raise if `instance` does not match TGI's component schema `name` (e.g. GenerateResponse)."""
    schema = {**_components(), "$ref": f"#/components/schemas/{name}"}
    jsonschema.Draft202012Validator(schema).validate(instance)


def sse_events(text: str) -> list[dict]:
    """The JSON payloads of a TGI stream (`data:` lines, with or without a space)."""
    events = []
    for line in text.splitlines():
        if line.startswith("data:"):
            events.append(json.loads(line[5:].strip()))
    return events
