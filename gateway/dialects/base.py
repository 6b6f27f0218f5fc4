"""What every public dialect provides: parse a body into internal requests, render results and errors."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from gateway.collect import Result
from gateway.errors import SluiceError, ValidationFailed
from common.protocol import Event, GenerateRequest


@dataclass
class Parsed:
    """A validated request: one internal GenerateRequest per prompt, plus what rendering needs."""

    model: str
    requests: list[GenerateRequest]
    stream: bool
    options: Any = None  # dialect-specific rendering options
    reserve_tokens: int = 0  # upper bound of tokens this request may cost (limits reserve this)
    extra: dict = field(default_factory=dict)


@dataclass
class Meta:
    request_id: str
    created: int
    model: str


class Dialect:
    name = "base"
    stream_media_type = "text/event-stream"

    def parse(self, payload: Any, route: str) -> Parsed:
        raise NotImplementedError

    def render(self, parsed: Parsed, results: list[Result], meta: Meta) -> Any:
        """The non-streamed body (a JSON-serialisable object)."""
        raise NotImplementedError

    def stream(self, parsed: Parsed, events: AsyncIterator[tuple[int, Event]], meta: Meta) -> AsyncIterator[bytes]:
        raise NotImplementedError

    def response_headers(self, parsed: Parsed, results: list[Result], elapsed: float,
                         checked: float) -> dict[str, str]:
        """Extra headers of a non-streamed reply (TGI's x-compute-time and friends); `elapsed` seconds since
        the request arrived, `checked` of them spent in the gateway before it reached a worker."""
        return {}

    def error_body(self, error: SluiceError) -> tuple[int, Any]:
        """(status, JSON body) of an error in this dialect's envelope."""
        return error.status, {"error": {"message": error.message, "type": error.type, "param": error.param,
                                        "code": error.code}}

    def stream_error(self, error: SluiceError) -> bytes:
        """An error that happens after a stream started, framed for this dialect."""
        return sse(self.error_body(error)[1])


_encoder = msgspec.json.Encoder()


def sse(payload: Any, space: bool = True) -> bytes:
    return (b"data: " if space else b"data:") + _encoder.encode(payload) + b"\n\n"


def convert(payload: Any, kind: type, what: str = "request body"):
    """Validate a decoded JSON value into a msgspec Struct, naming the offending field on failure."""
    if not isinstance(payload, dict):
        raise ValidationFailed(f"the {what} must be a JSON object")
    try:
        return msgspec.convert(payload, kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        param = None
        if "at `$." in message:
            param = message.split("at `$.", 1)[1].rstrip("`").split("[")[0].split(".")[0]
        elif "missing required field `" in message:
            param = message.split("missing required field `", 1)[1].split("`")[0]
        raise ValidationFailed(message, param=param) from exc


def incomplete(finish) -> dict:
    """`{"incomplete": true}` for a structured output cut before its grammar accepted, else nothing:
    merged into a finished choice so no dialect reports a silently invalid result."""
    return {"incomplete": True} if finish is not None and finish.incomplete else {}


def check(condition: bool, message: str, param: str) -> None:
    if not condition:
        raise ValidationFailed(message, param=param)


# ---- OpenAPI documentation of routes that read their body themselves ----


def json_schema(kind: Any) -> Any:
    """A Litestar `Schema` for a msgspec type (a Struct, `list[Struct]`...), `$ref`s inlined; a tuple of
    types means any of them (msgspec cannot express a union of untagged Structs)."""
    from litestar.openapi.spec import Schema

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
    from litestar.openapi.spec import OpenAPIType, Schema

    data = Schema(type=OpenAPIType.STRING, content_media_type="application/json", content_schema=json_schema(item))
    return Schema(type=OpenAPIType.OBJECT, required=["data"],
                  properties={"data": data, "event": Schema(type=OpenAPIType.STRING)})


def documented(body: Any = None, responses: dict[int, tuple[str, Any]] | None = None,
               stream_item: Any = None) -> type:
    """An `operation_class` for a route decorator: documents its JSON body and responses.

    `responses` maps a status to (description, msgspec type or None); `stream_item` documents the
    `text/event-stream` alternative of the 200 reply.
    """
    from litestar.openapi.spec import (
        OpenAPIMediaType,
        OpenAPIResponse,
        Operation,
        RequestBody,
    )

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
