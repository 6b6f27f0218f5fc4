"""The worker's HTTP face: submit a generation and stream its events back as NDJSON.

A client that disconnects mid-stream cancels the request (its rows leave the batch at the next step).
Bodies and events are the msgspec structs of `common.protocol`. With a secret, every route but
`/health` needs it (worker/secret.py).

Preparing a generation and the tokenizer routes run off the event loop and off the engine's thread, in
tenants' turns (worker/tenant_turns.py): one tenant's long prompts or token counts never hold another
tenant's request. A grammar a generation must compile is awaited on the loop, holding no thread and no turn
(`_prepare`), so compiles that wait or run for seconds (each tenant's bounded by
worker/decoding/grammar/fair_queue.py) never take the threads another tenant's requests are prepared on.
Their input is bounded: a prompt is tokenized no further than the context can hold
(worker/engine/prompt_tokens.py), /tokenize takes at most MAX_TOKENIZE_CHARS characters (about 100k tokens
of English, 0.5 s on one core; a million took 2 s and answered 20 MB of spans), /detokenize at most
MAX_DETOKENIZE_TOKENS ids.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from functools import partial

import msgspec
from litestar import Litestar, Request, Response, get, post
from litestar.response import Stream

from common.protocol import (
    ERROR_STATUS,
    DetokenizeRequest,
    DetokenizeResponse,
    Done,
    Error,
    GenerateRequest,
    ModelInfo,
    TokenizeRequest,
    TokenSpan,
    WorkerLoad,
    encode_event,
)
from worker.decoding.grammar import GrammarPending
from worker.engine.engine import Engine
from worker.engine.prepare import RequestRejected
from worker.secret import secret_guard
from worker.tenant_turns import TenantTurns
from worker.tools.errors import ToolError
from worker.tools.prompt import render_chat

MAX_TOKENIZE_CHARS = 1 << 18
MAX_DETOKENIZE_TOKENS = 1 << 17
_json = msgspec.json.Encoder()


def _error(kind: str, message: str, field: str | None = None) -> Response:
    return _refusal(Error(kind=kind, message=message, field=field))


def _refusal(error: Error) -> Response:
    return Response(_json.encode(error), status_code=ERROR_STATUS[error.kind], media_type="application/json")


def create_worker_app(engine: Engine, info: ModelInfo, secret: str | None = None) -> Litestar:
    decoder = msgspec.json.Decoder(GenerateRequest)
    turns = TenantTurns()

    @post("/generate", status_code=200)
    async def generate(request: Request) -> Response | Stream:
        try:
            body = decoder.decode(await request.body())
        except msgspec.DecodeError as exc:
            return _error("validation", f"invalid request: {exc}")
        try:
            prepared = await _prepare(engine, turns, body)
        except RequestRejected as exc:
            return _refusal(exc.event())
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def sink(batch: list) -> None:  # engine thread -> event loop
            loop.call_soon_threadsafe(events.put_nowait, batch)

        try:
            engine.submit(prepared, sink)
        except RequestRejected as exc:
            return _error(exc.kind, exc.message, exc.field)
        return Stream(_relay(engine, body.request_id, events), media_type="application/x-ndjson")

    @get("/load")
    async def load() -> WorkerLoad:
        return engine.load()

    @get("/info")
    async def model_info() -> ModelInfo:
        return info

    @get("/health")
    async def health() -> Response:
        ready = engine.load().ready
        return Response(b"", status_code=200 if ready else 503)

    @post("/tokenize", status_code=200)
    async def tokenize(data: TokenizeRequest) -> Response:
        try:
            spans = await turns.run(data.tenant, tokenize_spans, engine.tokenizer, data)
        except RequestRejected as exc:
            return _error(exc.kind, exc.message, exc.field)
        return Response(_json.encode(spans), media_type="application/json")

    @post("/detokenize", status_code=200)
    async def detokenize(data: DetokenizeRequest) -> Response:
        vocab = engine.vocab_size
        if len(data.tokens) > MAX_DETOKENIZE_TOKENS:
            return _error("validation", f"{len(data.tokens)} token ids; /detokenize takes at most "
                          f"{MAX_DETOKENIZE_TOKENS}", "tokens")
        bad = [t for t in data.tokens if not 0 <= t < vocab]
        if bad:
            return _error("validation", f"token id {bad[0]} is outside the vocabulary (0..{vocab - 1})", "tokens")
        text = await turns.run(data.tenant, partial(engine.tokenizer.decode,
                                                    skip_special_tokens=data.skip_special_tokens), data.tokens)
        return Response(_json.encode(DetokenizeResponse(text)), media_type="application/json")

    return Litestar([generate, load, model_info, health, tokenize, detokenize], debug=False,
                    before_request=secret_guard(secret) if secret else None)


async def _prepare(engine: Engine, turns: TenantTurns, body: GenerateRequest):
    """`engine.prepare` in a thread, in the tenant's turn; when its grammar is not compiled yet, the compile is
    awaited here, with no thread or turn held, and the request prepared again (its grammar then at hand, or its
    error: a timeout, a bad constraint). The compile goes on when the client leaves: it is the tenant's, cached
    for its retry."""
    try:
        return await turns.run(body.tenant, partial(engine.prepare, body, pending=True))
    except GrammarPending as pending:
        started = time.monotonic()
        waiter = asyncio.wrap_future(pending.future)
        waiter.add_done_callback(lambda done: done.cancelled() or done.exception())  # read again by the 2nd pass
        await asyncio.wait([waiter], timeout=pending.limit_s)  # neither raises nor cancels the compile
        waited = time.monotonic() - started
        return await turns.run(body.tenant, partial(engine.prepare, body, waited_s=waited))


async def _relay(engine: Engine, request_id: str, events: asyncio.Queue) -> AsyncIterator[bytes]:
    finished = False
    try:
        while not finished:
            batch = await events.get()
            for event in batch:
                finished = finished or isinstance(event, (Done, Error))
            yield b"".join(encode_event(event) for event in batch)
    finally:
        if not finished:  # the gateway went away: free the rows
            engine.cancel(request_id)


def tokenize_spans(tokenizer, data: TokenizeRequest) -> list[TokenSpan]:
    if data.messages is not None:
        try:  # the prompt a generation of these messages (and tools) would prefill
            text = render_chat(tokenizer, data.messages, data.tools, add_generation_prompt=True,
                               continue_final=data.continue_final_message, template_kwargs=data.chat_template_kwargs)
        except ToolError as exc:
            raise RequestRejected(exc.message, exc.field) from exc
        except Exception as exc:  # jinja errors on malformed messages are the client's problem
            raise RequestRejected(f"cannot apply the chat template: {exc}", "messages") from exc
        add_special = False
    else:
        text, add_special = data.text or "", data.add_special_tokens
    if len(text) > MAX_TOKENIZE_CHARS:
        raise RequestRejected(f"the text has {len(text)} characters; /tokenize takes at most {MAX_TOKENIZE_CHARS}",
                           "messages" if data.messages is not None else "text")
    encoded = tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
    return [TokenSpan(id=token, text=text[start:stop], start=start, stop=stop)
            for token, (start, stop) in zip(encoded.input_ids, encoded.offset_mapping)]
