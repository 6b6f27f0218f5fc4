"""OpenAPI documentation of routes that read their body themselves: `documented(...)` is an
`operation_class` that describes the JSON body and the responses from msgspec types."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar.openapi.spec import (
    OpenAPIMediaType,
    OpenAPIResponse,
    OpenAPIType,
    Operation,
    RequestBody,
    Schema,
)


def json_schema(kind: Any) -> Any:
    """A Litestar `Schema` for a msgspec type (a Struct, `list[Struct]`...), `$ref`s inlined; a tuple of
    types means any of them (msgspec cannot express a union of untagged Structs)."""
    if isinstance(kind, tuple):
        return Schema(any_of=[json_schema(k) for k in kind])
    raw = msgspec.json.schema(kind)
    defs = raw.pop("$defs", {})
    names = {"anyOf": "any_of", "oneOf": "one_of", "allOf": "all_of", "additionalProperties": "additional_properties",
             "exclusiveMinimum": "exclusive_minimum", "exclusiveMaximum": "exclusive_maximum", "minItems": "min_items",
             "maxItems": "max_items", "minLength": "min_length", "maxLength": "max_length"}
    plain = {"type", "enum", "const", "minimum", "maximum", "format", "title", "description", "default", "pattern"}

    def build(node: dict) -> Schema:
        if "$ref" in node:
            return build(defs[node["$ref"].rsplit("/", 1)[1]])
        fields: dict = {}
        for key, value in node.items():
            if key == "properties":
                fields["properties"] = {k: build(v) for k, v in value.items()}
            elif key == "items":
                fields["items"] = build(value)
            elif key == "required":
                fields["required"] = list(value)
            elif key in ("anyOf", "oneOf", "allOf"):
                fields[names[key]] = [build(v) for v in value]
            elif key == "additionalProperties":
                fields[names[key]] = value if isinstance(value, bool) else build(value)
            elif key in names:
                fields[names[key]] = value
            elif key in plain:
                fields[key] = value
        return Schema(**fields)

    return build(raw)


def sse_event_schema(item: Any) -> Any:
    """One server-sent event: its `data` is the JSON text of `item` (OpenAPI 3.2's itemSchema layout)."""
    data = Schema(type=OpenAPIType.STRING, content_media_type="application/json", content_schema=json_schema(item))
    return Schema(type=OpenAPIType.OBJECT, required=["data"],
                  properties={"data": data, "event": Schema(type=OpenAPIType.STRING)})


def documented(body: Any = None, responses: dict[int, tuple[str, Any]] | None = None,
               stream_item: Any = None) -> type:
    """An `operation_class` for a route decorator: documents its JSON body and responses.

    `responses` maps a status to (description, msgspec type or None); `stream_item` documents the
    `text/event-stream` alternative of the 200 reply.
    """
    class DocumentedOperation(Operation):
        def __init__(self, *args, **kwargs) -> None:  # Operation is a dataclass without __post_init__
            super().__init__(*args, **kwargs)
            if body is not None:
                self.request_body = RequestBody(
                    content={"application/json": OpenAPIMediaType(schema=json_schema(body))}, required=True)
            if responses:
                documented_responses = {}
                for status, (description, kind) in responses.items():
                    content = {}
                    if kind is not None:
                        content["application/json"] = OpenAPIMediaType(schema=json_schema(kind))
                    if status == 200 and stream_item is not None:
                        content["text/event-stream"] = OpenAPIMediaType(schema=sse_event_schema(stream_item))
                    documented_responses[str(status)] = OpenAPIResponse(description=description,
                                                                        content=content or None)
                self.responses = documented_responses

    return DocumentedOperation
