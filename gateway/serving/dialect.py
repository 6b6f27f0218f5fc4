"""What every public dialect provides: parse a body into internal requests, render results and errors.

A dialect renders every error of its routes: mount its routes in a Litestar `Router` with
`exception_handlers=DIALECT.exception_handlers()` and whatever a handler, a dependency, a guard or the
authentication middleware raises is answered in the dialect's envelope. The base class answers in the
OpenAI envelope, which is also the answer of the admin and usage APIs and of unknown paths.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import msgspec
from litestar import Request, Response
from litestar.types import ExceptionHandlersMap

from common.errors import invalid_field
from common.protocol import Event, Finish, GenerateRequest
from gateway.errors import SluiceError, ValidationFailed, as_sluice_error
from gateway.serving.collect import Result


@dataclass
class Parsed:
    """A validated request: one internal GenerateRequest per prompt, plus what rendering needs."""

    model: str
    requests: list[GenerateRequest]
    stream: bool
    options: Any = None  # dialect-specific rendering options
    extra: dict = field(default_factory=dict)
    adapter: str | None = None  # a registered LoRA adapter named by the body (TGI adapter_id, SGLang lora_path)
    adapter_field: str = "model"  # the field that named it, for the 404


@dataclass
class Meta:
    request_id: str
    created: int
    model: str


class Dialect:
    name = "base"
    stream_media_type = "text/event-stream"
    model_optional = False  # True: a body that names no model is served by the first one (TGI, SGLang)
    # True: its finish vocabulary says when a choice failed (SGLang's `abort`); else a failed choice fails
    # the request (gateway.serving.answer.honest)
    reports_failed_choices = False
    # True: `render` is a pure function of its arguments, so a large answer may be rendered in another process
    # (gateway/serving/answer_body.py); a dialect that keeps what it rendered says False
    renders_elsewhere = True

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

    def reported(self, error: SluiceError) -> SluiceError:
        """The error as this dialect's real server reports it (its status, its wording): what the client gets
        and what the ledger records. The base keeps it as raised."""
        return error

    def error_body(self, error: SluiceError) -> tuple[int, Any]:
        """(status, JSON body) of an error in this dialect's envelope."""
        error = self.reported(error)
        return error.status, openai_envelope(error)

    def error_response(self, error: SluiceError, headers: dict[str, str] | None = None) -> Response:
        status, body = self.error_body(error)
        return Response(_encoder.encode(body), status_code=status, media_type="application/json",
                         headers={**error.response_headers(), **(headers or {})})

    def exception_handlers(self) -> ExceptionHandlersMap:
        def render(_: Request, exc: Exception) -> Response:
            return self.error_response(as_sluice_error(exc))

        return {Exception: render}

    def stream_error(self, error: SluiceError) -> bytes:
        """An error that happens after a stream started, framed for this dialect."""
        return sse(self.error_body(error)[1])


_encoder = msgspec.json.Encoder()
DEFAULT = Dialect()  # the OpenAI envelope, for routes outside every dialect


def openai_envelope(error: SluiceError) -> dict:
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code,
                      **error.fields}}


def sse(payload: Any, space: bool = True, event: str | None = None) -> bytes:
    """One server-sent event, the framing of every dialect's stream: `event: <name>` when named (Anthropic,
    Responses), then `data: <JSON>` (`data:<JSON>` without the space, as Friendli's servers write)."""
    head = b"" if event is None else b"event: " + event.encode() + b"\n"
    return head + (b"data: " if space else b"data:") + _encoder.encode(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"  # the end of an OpenAI-shaped stream (OpenAI, SGLang, Monster)


def convert(payload: Any, kind: type, what: str = "request body") -> Any:
    """Validate a decoded JSON value into a msgspec Struct, naming the offending field on failure."""
    if not isinstance(payload, dict):
        raise ValidationFailed(f"the {what} must be a JSON object")
    try:
        return msgspec.convert(payload, kind)
    except msgspec.ValidationError as exc:
        message = str(exc)
        code = "invalid_type" if message.startswith("Expected `") else None  # OpenAI's codes
        if "at `$." not in message and "missing required field `" in message:
            code = "missing_required_parameter"
        param = invalid_field(exc)
        raise ValidationFailed(message, param=param, code=code) from exc


def unknown_fields(payload: Any, kind: type[msgspec.Struct], tolerated: frozenset[str] = frozenset()) -> list[str]:
    """The keys of a body object that `kind` does not declare and `tolerated` does not name, whose value is not
    null (a null asks for nothing: clients that send every key they know, mostly null, stay welcome)."""
    if not isinstance(payload, dict):
        return []
    return [key for key, value in payload.items()
            if value is not None and key not in kind.__struct_fields__ and key not in tolerated]


def incomplete(finish: Finish | None) -> dict[str, bool]:
    """`{"incomplete": true}` for a structured output cut before its grammar accepted, else nothing:
    merged into a finished choice so no dialect reports a silently invalid result."""
    return {"incomplete": True} if finish is not None and finish.incomplete else {}


def check(condition: bool, message: str, param: str) -> None:
    if not condition:
        raise ValidationFailed(message, param=param)


def required(present: bool, param: str) -> None:
    """A required field: when it is missing, OpenAI's `missing_required_parameter` naming it."""
    if not present:
        raise ValidationFailed(f"{param} is required", param=param, code="missing_required_parameter")


def fail(message: str, param: str) -> NoReturn:
    """For a message that must be formatted: `if not ok: fail(f"...")` formats it only when it is needed
    (`check(ok, f"...")` formats it on every request, and these checks run many times per request)."""
    raise ValidationFailed(message, param=param)
