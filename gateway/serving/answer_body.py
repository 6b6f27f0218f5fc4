"""A collected answer's body: rendered in the dialect and encoded to JSON, off the event loop when it is large.

Rendering walks every token in Python, and a large answer (`n` = 32 with 20 top logprobs each: 9.5 MiB of
JSON) held the event loop for over a second: every other team's streams, and `/livez`, waited for it. An
answer heavier than OFF_LOOP_WEIGHT (tokens, plus the alternatives, ids and values each one carries:
`Result.weight`) is built in a thread, at most RENDER_THREADS of them at once; the loop keeps its turns at the
GIL meanwhile (one every `sys.getswitchinterval()`, 5 ms). Beyond RENDER_THREADS, large answers wait for one
another on the loop, so they never take all the threads the rest of the gateway hands work to. A smaller
answer is built on the loop: a hand-off costs more than its render.

A thread gives the loop its turn only between Python steps, and msgspec encodes a whole answer in one C call
(tens of milliseconds for megabytes): a large answer is encoded in pieces (`encode_in_pieces`: each container
down to PIECE_DEPTH item by item, what lies deeper whole: a token's entry, its top logprobs), each a short call,
the same bytes as one call.
"""

from __future__ import annotations

import asyncio
import weakref
from functools import partial
from typing import Any

import msgspec

from gateway.serving.collect import Result
from gateway.serving.dialect import Dialect, Meta, Parsed

OFF_LOOP_WEIGHT = 4096
RENDER_THREADS = 2
PIECE_DEPTH = 5  # answer > choices > choice > logprobs > content: below, one token's entry is one piece

_json = msgspec.json.Encoder()
_renders: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def off_loop(results: list[Result]) -> bool:
    """Whether this answer is built off the event loop."""
    return sum(result.weight for result in results) > OFF_LOOP_WEIGHT


async def answer_body(dialect: Dialect, parsed: Parsed, results: list[Result], meta: Meta) -> bytes:
    build = partial(_build, dialect, parsed, results, meta)
    if not off_loop(results):
        return build()
    loop = asyncio.get_running_loop()
    renders = _renders.get(loop) or _renders.setdefault(loop, asyncio.Semaphore(RENDER_THREADS))
    async with renders:
        return await asyncio.to_thread(build)  # the request's bound log fields go along (contextvars)


def _build(dialect: Dialect, parsed: Parsed, results: list[Result], meta: Meta) -> bytes:
    rendered = dialect.render(parsed, results, meta)
    return encode_in_pieces(rendered) if off_loop(results) else _json.encode(rendered)


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
