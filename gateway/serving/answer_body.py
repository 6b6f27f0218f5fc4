"""A collected answer's body: its tokens decoded, rendered in the dialect and encoded to JSON, off the event loop
when it is large.

Decoding, rendering and encoding walk every token in Python: an answer of `n` = 32 with 20 top logprobs a token
(12 MiB of JSON) took a second, during which every other team's streams, and `/livez`, waited. The relay hands a
collected answer's tokens over undecoded (gateway/replicas/token_lines.py); an answer whose token lines pass
OFF_LOOP_BYTES (or whose decoded tokens pass OFF_LOOP_WEIGHT) is decoded, rendered and encoded in the render
process, in its team's turn (gateway/serving/render_process.py), the loop only moving its bytes. A smaller one is
built on the loop: a few milliseconds at most, less than the hand-over's latency.

A dialect whose render keeps state for later (the Responses API stores what it rendered: `renders_elsewhere`
False) builds a large answer in a thread instead, at most RENDER_THREADS at once, and encodes it in pieces
(`encode_in_pieces`: each container down to PIECE_DEPTH item by item, the same bytes as one call), so that the
loop gets its turns at the GIL between them. Its answers have one choice.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

import msgspec
import structlog

from gateway.errors import UpstreamFailed
from gateway.serving.collect import Result
from gateway.serving.dialect import Dialect, Meta, Parsed
from gateway.serving.render_process import RENDERER, render

OFF_LOOP_BYTES = 32 << 10  # token lines: about 5 ms of the loop at worst (20 top logprobs a token), 1 ms without
OFF_LOOP_WEIGHT = 4096  # decoded tokens and the values they carry (Result.weight)
RENDER_THREADS = 2
PIECE_DEPTH = 5  # answer > choices > choice > logprobs > content: below, one token's entry is one piece

log = structlog.get_logger("gateway")
_json = msgspec.json.Encoder()
_renders: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()
UNREADABLE = "the worker sent an event the gateway cannot read"


def off_loop(results: list[Result]) -> bool:
    """Whether this answer is built off the event loop."""
    return (sum(result.line_bytes for result in results) > OFF_LOOP_BYTES
            or sum(result.weight for result in results) > OFF_LOOP_WEIGHT)


async def answer_body(dialect: Dialect, parsed: Parsed, results: list[Result], meta: Meta, owner: str) -> bytes:
    """The body; a large one built off the loop, in `owner`'s turn where the render process builds it."""
    try:
        if not off_loop(results):
            return render(dialect, parsed, results, meta)
        if dialect.renders_elsewhere:
            return await RENDERER.render(owner, dialect, parsed, results, meta)
        loop = asyncio.get_running_loop()
        renders = _renders.get(loop) or _renders.setdefault(loop, asyncio.Semaphore(RENDER_THREADS))
        async with renders:
            return await asyncio.to_thread(_in_thread, dialect, parsed, results, meta)  # log fields go along
    except msgspec.DecodeError as exc:  # no retry: any replica would send the same
        log.warning("worker_event_unreadable", error=str(exc))
        raise UpstreamFailed(UNREADABLE) from exc


def _in_thread(dialect: Dialect, parsed: Parsed, results: list[Result], meta: Meta) -> bytes:
    for result in results:
        result.decode_lines()
    return encode_in_pieces(dialect.render(parsed, results, meta))


def encode_in_pieces(value: Any) -> bytes:
    """msgspec's JSON of `value`, byte for byte, made of one short encode per piece (module docstring)."""
    return b"".join(pieces_of(value))


def pieces_of(value: Any) -> list[bytes]:
    pieces: list[bytes] = []
    _encode(value, pieces, 0)
    return pieces


def _encode(value: Any, pieces: list[bytes], depth: int) -> None:
    if depth < PIECE_DEPTH and type(value) is list and len(value) > 1:
        pieces.append(b"[")
        for index, item in enumerate(value):
            if index:
                pieces.append(b",")
            _encode(item, pieces, depth + 1)
        pieces.append(b"]")
    elif depth < PIECE_DEPTH and type(value) is dict and len(value) > 1 and all(type(k) is str for k in value):
        pieces.append(b"{")
        for index, (key, item) in enumerate(value.items()):
            pieces.append(b"," + _json.encode(key) + b":" if index else _json.encode(key) + b":")
            _encode(item, pieces, depth + 1)
        pieces.append(b"}")
    else:
        pieces.append(_json.encode(value))
