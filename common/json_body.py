"""The one step that turns a request body into a JSON value, shared by every route of every dialect and
by the admin and usage APIs. Each refusal is a 4xx naming the problem, which the route's dialect renders:

- a content type other than JSON (`application/json`, `application/*+json`, or none at all, since curl-like
  callers often send none) is 415; a charset other than UTF-8 is 415 too;
- a body over the size limit (`max_body_bytes`, 4 MiB by default) is 413;
- an empty body, bytes that are not UTF-8, nesting deeper than MAX_DEPTH, `NaN` / `Infinity`, numbers out
  of range and anything after the JSON value are 400 `invalid_json`.

The nesting limit is checked before decoding, so a body of 5,000 `[` never reaches a recursive parser.
A body over `LARGE_BODY_BYTES` is decoded off the event loop, in its owner's turn (common/large_bodies.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import msgspec
from litestar import Request

from common.errors import BodyIncomplete, InvalidJSON, PayloadTooLarge, UnsupportedMediaType
from common.headers import header
from common.large_bodies import LARGE_BODY_BYTES, TURNS, owner_of

if TYPE_CHECKING:
    from litestar.types import HTTPRequestEvent

MAX_DEPTH = 64  # arrays and objects inside each other; real bodies stay under 10, a JSON schema under 30
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.S)  # possessive: an unterminated string fails in linear time
_OPEN_CLOSE = bytes.maketrans(b"[{]}", b"(())")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_NON_FINITE = re.compile(rb"(?<![\w.])-?(?:NaN|Infinity)(?![\w.])")
_decoder = msgspec.json.Decoder()
T = TypeVar("T")


def check_content_type(header: str | None) -> None:
    if not header:
        return
    media, _, parameters = header.partition(";")
    media = media.strip().lower()
    if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
        raise UnsupportedMediaType(f"the request body must be JSON: send Content-Type: application/json "
                                   f"(got {media[:100]!r})")
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            raise UnsupportedMediaType(f"the request body must be UTF-8 JSON: send Content-Type: application/json "
                                       f"(got charset {value.strip()[:40]!r})")


def nesting_depth_exceeds(raw: bytes, limit: int) -> bool:
    """Whether arrays and objects nest deeper than `limit`, string contents ignored, without a parser: on the
    brackets alone (`(` opens, `)` closes), a run of k openers is k levels, and each pass that removes every
    innermost `()` takes one level off. All of it runs in C; a body with few containers returns at once."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    nesting = _STRING.sub(b"", raw).translate(_OPEN_CLOSE, _NOT_BRACKETS)
    for removed in range(limit + 1):
        if b"(" * (limit + 1 - removed) in nesting:
            return True
        if b"()" not in nesting:
            return False
        nesting = nesting.replace(b"()", b"")
    return False


def decode_json(raw: bytes, max_bytes: int | None = None) -> Any:
    """A JSON body (bytes) -> the decoded value, or the 4xx that names what is wrong with it."""
    if max_bytes is not None and len(raw) > max_bytes:
        raise PayloadTooLarge(f"the request body exceeds {max_bytes} bytes")
    if not raw.strip():
        raise InvalidJSON("the request body is empty: send a JSON object")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidJSON(f"the request body is not valid UTF-8 (byte {exc.start}): send UTF-8 JSON") from None
    if nesting_depth_exceeds(raw, MAX_DEPTH):
        raise InvalidJSON(f"the request body nests arrays and objects deeper than {MAX_DEPTH} levels")
    try:
        return _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        if _NON_FINITE.search(_STRING.sub(b"", raw)):
            raise InvalidJSON("the request body is not valid JSON: NaN and Infinity are not JSON numbers") from None
        raise InvalidJSON(f"the request body is not valid JSON: {exc}") from None


async def read_json(request: Request[Any, Any, Any]) -> Any:
    """Read and decode a request's JSON body; the size limit is the route's `request_max_body_size`. Also a
    dependency provider: `Provide(read_json)` under the name `payload`."""
    return await _read(request, optional=False)


async def read_optional_json(request: Request[Any, Any, Any]) -> Any:
    """The same for a body that may be left out: an empty body reads as `{}`."""
    return await _read(request, optional=True)


async def read_json_then(request: Request[Any, Any, Any], then: Callable[[Any], T]) -> T:
    """`then(value)` of the decoded body, where the body is decoded: for a large body, off the event loop in one
    turn with its decoding (what a generation route does first with it, its dialect's parse, is as heavy)."""
    result: T = await _read(request, optional=False, then=then)
    return result


async def _read(request: Request[Any, Any, Any], optional: bool, then: Callable[[Any], Any] | None = None) -> Any:
    check_content_type(header(request, b"content-type"))
    limit = request.route_handler.resolve_request_max_body_size()
    announced = header(request, b"content-length")
    if announced is not None and announced.isdigit() and int(announced) > LARGE_BODY_BYTES:
        TURNS.check_room(owner_of(request.scope))  # a body that would wait behind its owner's is not read
    raw = await read_body(request, limit)
    if optional and not raw.strip():
        return {} if then is None else then({})

    def decoded() -> Any:
        value = decode_json(raw, limit)
        return value if then is None else then(value)

    if len(raw) > LARGE_BODY_BYTES:  # tens of milliseconds of C holding the GIL: not on the loop, and in turns
        return await TURNS.run(owner_of(request.scope), decoded)
    return decoded()


async def read_body(request: Request[Any, Any, Any], limit: int | None) -> bytes:
    """The request's body from its ASGI messages, refused (413) past `limit` bytes the way Litestar's
    `request.body()` refuses it: by the announced content-length before anything is read, then by the bytes that
    came. Litestar's version builds its multi-dict of every header first and gathers the chunks through a
    generator, work a generation request need not pay. A connection that ends before the body did (the
    client left, or `[http] body_timeout_s` cut it) is BodyIncomplete, a 408 nobody reads, not a fault."""
    announced = header(request, b"content-length")
    if limit is not None and announced is not None and announced.isdigit() and int(announced) > limit:
        raise PayloadTooLarge(f"the request body exceeds {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise BodyIncomplete("the connection ended before the request body did")
        message = cast("HTTPRequestEvent", message)  # typed as any ASGI message; an HTTP request's is one of two
        if chunk := message.get("body", b""):
            size += len(chunk)
            if limit is not None and size > limit:
                raise PayloadTooLarge(f"the request body exceeds {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
