"""A worker that plays the worker protocol (common/protocol.py) without a model, for load and fault tests
of the gateway: `POST /generate` streams `Accepted`, `max_tokens` `Token`s (64 when unset), `Finish`, `Done`
as NDJSON, one token every `--token-delay` seconds. It keeps the books a real worker's scheduler keeps
(rows started, finished, cancelled when the gateway went away mid-stream, still running), served at
`GET /stats`, so a test can check that every cut stream freed its row.

Run: python -m tests.faults.stub_worker --port P [--token-delay S] [--token-bytes B]
"""

from __future__ import annotations

import argparse
import asyncio
import gc

import msgspec
import uvicorn

from common.protocol import (
    Accepted,
    Done,
    Error,
    Finish,
    GenerateRequest,
    ModelInfo,
    Token,
    WorkerLoad,
    encode_event,
)
from tests.fixtures.servers import read_body

DEFAULT_TOKENS = 64
MAX_ROWS = 4096


class Stats(msgspec.Struct):
    started: int = 0
    finished: int = 0
    cancelled: int = 0
    running: int = 0
    cancelled_ids: list[str] = []


class StubWorker:
    def __init__(self, model: str, token_delay: float, token_bytes: int) -> None:
        self.model, self.token_delay = model, token_delay
        self.text = ("x" * max(token_bytes - 1, 0)) + " "
        self.stats = Stats()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        path = scope["path"]
        if path == "/generate" and scope["method"] == "POST":
            await self.generate(receive, send)
        elif path == "/load":
            await _json(send, WorkerLoad(ready=True, model=self.model, queued=0, running_rows=self.stats.running,
                                         max_rows=MAX_ROWS, free_cache_tokens=1 << 20, worker_id="stub"))
        elif path == "/info":
            await _json(send, ModelInfo(model_id=self.model, model_dtype="float32", device="cpu", quantization="none",
                                        max_context=4096, max_rows=MAX_ROWS, vocab_size=49152, eos_token_ids=[2],
                                        worker_id="stub"))
        elif path == "/health":
            await _json(send, {"status": "ok"})
        elif path == "/stats":
            await _json(send, self.stats)
        else:
            await _json(send, Error("not_found", f"no route {path}"), status=404)

    async def generate(self, receive, send) -> None:
        body = await read_body(receive)
        request = msgspec.json.decode(body, type=GenerateRequest)
        count = request.params.max_tokens if request.params.max_tokens is not None else DEFAULT_TOKENS
        stats = self.stats
        stats.started += 1
        stats.running += 1
        streaming = asyncio.create_task(self._stream(send, request, count))
        gone = asyncio.create_task(_disconnected(receive))
        try:
            await asyncio.wait([streaming, gone], return_when=asyncio.FIRST_COMPLETED)
            if streaming.done() and streaming.exception() is None:
                stats.finished += 1
            else:  # the gateway closed the connection (or a write to it failed): the row is freed
                streaming.cancel()
                await asyncio.gather(streaming, return_exceptions=True)
                stats.cancelled += 1
                stats.cancelled_ids.append(request.request_id)
        finally:
            gone.cancel()
            stats.running -= 1

    async def _stream(self, send, request: GenerateRequest, count: int) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})
        prompt = len((request.prompt or "").encode()) + 1
        await _body(send, encode_event(Accepted(prompt, list(range(prompt)), [0], worker_id="stub")))
        for index in range(count):
            await asyncio.sleep(self.token_delay)
            await _body(send, encode_event(Token(0, 100 + index % 1000, self.text)))
        await _body(send, encode_event(Finish(0, "length", self.text * count, [100] * count, 0)))
        await _body(send, encode_event(Done(prompt, count, count, worker_id="stub")))
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _body(send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _json(send, value, status: int = 200) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": msgspec.json.encode(value)})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default="stub-model")
    parser.add_argument("--token-delay", type=float, default=0.01)
    parser.add_argument("--token-bytes", type=int, default=4)
    args = parser.parse_args()
    app = StubWorker(args.model, args.token_delay, args.token_bytes)
    # what is loaded by now lives as long as the process: the collector need not walk it (the gateway does the same
    # once started, gateway/cli/draining.py). Walking it cost this stub pauses of 10-25 ms four times a second under the
    # bench's load, noise in the tail of the stub alone and of every gateway measured in front of it
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", loop="uvloop", http="httptools",
                backlog=4096)


if __name__ == "__main__":
    main()
