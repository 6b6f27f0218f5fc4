"""The one worker of the test kit that plays the gateway-worker protocol (common.protocol) without a model: for
gateway tests that need an answer the real model cannot be made to give on demand (a worker overloaded, a
deadline passed mid-stream, a connection that dies, a stream that stays silent) and for the load the fault tests
and bench/gateway.py send. It is not our worker mocked: it speaks the wire contract over real HTTP, and the
gateway under test is the real one.

Each `POST /generate` takes the next `Reply` of `worker.replies` (the last one repeats), or the one `worker.reply_for`
chooses from the request's body:
- `Reply(events)`: a 200 NDJSON stream of scripted events, optionally `pause_s` before each, or held after
  `hold_after` of them until `worker.release` is set;
- `Reply.counted(token_delay, token_bytes)`: a stream made from the request, `Accepted`, `max_tokens` `Token`s
  (64 when unset) one every `token_delay` seconds, `Finish`, `Done`: the load of the fault tests and benches;
- `Reply.refused(status, kind, message)`: an HTTP error with an `Error` body; `Reply.bare(status, body)`: an
  error that is not the protocol's (what a proxy in the way answers);
- `Reply.dropped(events)`: these events, then the connection dies, as when a worker process dies; with no events it
  closes before any answer.
`POST /tokenize` answers one token per word (its id: the word's position; `messages`: the words of their
contents), `POST /detokenize` the ids as `<id>` words; both after `tokenizer_pause_s`, or refused as
`tokenizer_refusal` says. `GET /stats` serves the row books a real worker's scheduler keeps (streams started,
finished, cancelled because the gateway went away, running), so that a test can check that every cut stream freed
its row.

In the test's process: `protocol_worker()` (uvicorn on a thread). In its own process: `worker_process()`, which
runs `python -m testkit.protocol_worker --port P [--token-delay S] [--token-bytes B]` (counted replies).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import uvicorn

from common.protocol import (
    Accepted,
    DetokenizeResponse,
    Done,
    Error,
    Event,
    Finish,
    GenerateRequest,
    ModelInfo,
    Token,
    TokenSpan,
    WorkerLoad,
    encode_event,
)
from testkit.servers import free_port, read_body
from testkit.sluice import REPO, SluiceServer, running_sluice, wait_for_health

MODEL = "stub-model"
COUNTED_TOKENS = 64  # a counted reply's tokens when the request sets no max_tokens


@dataclass
class Reply:
    events: list[Event] = field(default_factory=list)
    status: int = 200  # not 200: `error` (or `body`) is the answer
    error: Error | None = None
    body: bytes = b""  # a bare (non-protocol) error body
    pause_s: float = 0.0  # before each event
    hold_after: int | None = None  # after this many events, wait for the worker's `release`
    cut: bool = False  # after the events, the connection dies
    token_delay: float | None = None  # not None: a counted reply (the events come from the request)
    token_bytes: int = 4
    at_once: bool = False  # the events encoded once and sent as one body each time (a bench's large answer)

    @functools.cached_property
    def encoded(self) -> bytes:
        return b"".join(map(encode_event, self.events))

    @classmethod
    def refused(cls, status: int, kind: str, message: str) -> Reply:
        return cls(status=status, error=Error(kind=kind, message=message))

    @classmethod
    def bare(cls, status: int, body: bytes) -> Reply:
        return cls(status=status, body=body)

    @classmethod
    def dropped(cls, events: list[Event] | None = None) -> Reply:
        """The connection dies after `events` (none: before any answer)."""
        return cls(events=list(events or []), cut=True)

    @classmethod
    def counted(cls, token_delay: float = 0.0, token_bytes: int = 4) -> Reply:
        return cls(token_delay=token_delay, token_bytes=token_bytes)


def tokens(text: str = "Hi there", reason: str = "eos_token", index: int = 0, incomplete: bool = False,
           worker_id: str = "") -> list[Event]:
    """A complete, well-formed answer: one token per word, its Finish, then Done."""
    words = text.split(" ")
    pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
    ids = list(range(10, 10 + len(pieces)))
    return [Accepted(prompt_tokens=3, prompt_ids=[1, 2, 3], seeds=[7], worker_id=worker_id),
            *[Token(index=index, token_id=t, text=p, logprob=-0.5) for t, p in zip(ids, pieces)],
            Finish(index=index, reason=reason, text=text, token_ids=ids, seed=7, incomplete=incomplete),
            Done(prompt_tokens=3, completion_tokens=len(ids), compute_tokens=len(ids), worker_id=worker_id)]


class Stats(msgspec.Struct):
    """The row books, served at `GET /stats`."""

    started: int = 0
    finished: int = 0  # the worker ended the stream (cut ones too)
    cancelled: int = 0  # the gateway closed the connection (or a write to it failed) mid-stream
    running: int = 0
    cancelled_ids: list[str] = []


@dataclass
class ProtocolWorker:
    url: str
    replies: list[Reply] = field(default_factory=lambda: [Reply(tokens())])
    model: str = MODEL
    worker_id: str = ""
    max_rows: int = 16
    max_context: int = 2048
    free_cache_tokens: int = 4096
    vocab_size: int = 1000
    record: bool = True  # keep `requests` and `disconnected` (a bench's stub process keeps only the counts)
    requests: list[dict] = field(default_factory=list)  # the GenerateRequest bodies received
    generate_calls: int = 0  # every `POST /generate`, answered or not
    tokenizer_calls: list[str] = field(default_factory=list)  # the paths of tokenize and detokenize calls
    tokenizer_refusal: Reply | None = None  # set: every tokenizer call is refused so (an error, or dropped)
    tokenizer_pause_s: float = 0.0  # before a tokenizer answer
    disconnected: list[bool] = field(default_factory=list)  # per stream: the gateway hung up mid-stream
    stats: Stats = field(default_factory=Stats)
    release: threading.Event = field(default_factory=threading.Event)  # lets held streams go on
    # set: the reply to each request, chosen from its body (a dict), instead of `replies` in turn
    reply_for: Callable[[dict], Reply] | None = None

    @property
    def streaming(self) -> int:
        """Streams open now."""
        return self.stats.running

    def next_reply(self) -> Reply:
        return self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]

    def app(self):
        """This worker as an ASGI app."""
        encoder = msgspec.json.Encoder()
        info = encoder.encode(ModelInfo(model_id=self.model, model_dtype="float32", device="cpu",
                                        quantization="none", max_context=self.max_context, max_rows=self.max_rows,
                                        vocab_size=self.vocab_size, eos_token_ids=[0], worker_id=self.worker_id))

        async def app(scope, receive, send):
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
                return
            path = scope["path"]
            if path == "/generate":
                return await self._generate(receive, send, encoder)
            if path == "/load":
                load = WorkerLoad(ready=True, model=self.model, queued=0, running_rows=self.stats.running,
                                  max_rows=self.max_rows, free_cache_tokens=self.free_cache_tokens,
                                  worker_id=self.worker_id)
                return await _send_json(send, 200, encoder.encode(load))
            if path == "/info":
                return await _send_json(send, 200, info)
            if path == "/health":
                return await _send_json(send, 200, b"")
            if path == "/stats":
                return await _send_json(send, 200, encoder.encode(self.stats))
            if path in ("/tokenize", "/detokenize"):
                self.tokenizer_calls.append(path)
                return await self._tokenizer(path, receive, send, encoder)
            return await _send_json(send, 404, encoder.encode(Error("not_found", f"no route {path}")))

        return app

    async def _tokenizer(self, path: str, receive, send, encoder: msgspec.json.Encoder) -> None:
        body = await read_body(receive)
        await asyncio.sleep(self.tokenizer_pause_s)
        if (refusal := self.tokenizer_refusal) is not None:
            return await _refuse(refusal, receive, send, encoder)
        return await _send_json(send, 200, encoder.encode(_tokenizer_reply(path, body)))

    async def _generate(self, receive, send, encoder: msgspec.json.Encoder) -> None:
        body = await read_body(receive)
        self.generate_calls += 1
        if self.reply_for is not None:
            sent = msgspec.json.decode(body)
            reply = self.reply_for(sent)
        else:
            sent, reply = None, self.next_reply()
        if reply.token_delay is not None:  # a counted reply reads the request as the worker does
            request = msgspec.json.decode(body, type=GenerateRequest)
            request_id = request.request_id
        else:
            request, sent = None, sent if sent is not None else msgspec.json.decode(body)
            request_id = sent.get("request_id", "")
        if self.record:
            self.requests.append(msgspec.json.decode(body) if request is not None else sent)
        if _refuses(reply):
            return await _refuse(reply, receive, send, encoder)
        index = len(self.disconnected)
        if self.record:
            self.disconnected.append(False)
        stats = self.stats
        stats.started += 1
        stats.running += 1
        streaming = asyncio.create_task(self._stream(reply, request, receive, send))
        gone = asyncio.create_task(_disconnect(receive))
        try:
            await asyncio.wait([streaming, gone], return_when=asyncio.FIRST_COMPLETED)
            if streaming.done() and streaming.exception() is None:
                stats.finished += 1
            else:  # the gateway closed the connection (or a write to it failed): the row is freed
                streaming.cancel()
                await asyncio.gather(streaming, return_exceptions=True)
                stats.cancelled += 1
                stats.cancelled_ids.append(request_id)
                if self.record:
                    self.disconnected[index] = True
        finally:
            gone.cancel()
            stats.running -= 1

    async def _stream(self, reply: Reply, request: GenerateRequest | None, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})
        if reply.token_delay is not None:
            return await self._count(reply, request, send)
        if reply.at_once:
            await _send_body(send, reply.encoded)
            await send({"type": "http.response.body", "body": b""})
            return
        for number, event in enumerate(reply.events):
            if number == reply.hold_after:
                while not self.release.is_set():
                    await asyncio.sleep(0.01)
            if reply.pause_s:
                await asyncio.sleep(reply.pause_s)
            await _send_body(send, encode_event(event))
        if reply.cut:
            return _drop_connection(receive)
        await send({"type": "http.response.body", "body": b""})

    async def _count(self, reply: Reply, request: GenerateRequest, send) -> None:
        count = request.params.max_tokens if request.params.max_tokens is not None else COUNTED_TOKENS
        text = ("x" * max(reply.token_bytes - 1, 0)) + " "
        prompt = len((request.prompt or "").encode()) + 1
        worker_id = self.worker_id or "stub"
        await _send_body(send, encode_event(Accepted(prompt, list(range(prompt)), [0], worker_id=worker_id)))
        for index in range(count):
            await asyncio.sleep(reply.token_delay)
            await _send_body(send, encode_event(Token(0, 100 + index % 1000, text)))
        await _send_body(send, encode_event(Finish(0, "length", text * count, [100] * count, 0)))
        await _send_body(send, encode_event(Done(prompt, count, count, worker_id=worker_id)))
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _refuses(reply: Reply) -> bool:
    """The reply is no stream: an error status, or a connection dropped before any answer."""
    return reply.status != 200 or (reply.cut and not reply.events)


async def _refuse(reply: Reply, receive, send, encoder: msgspec.json.Encoder) -> None:
    if reply.cut:
        return _drop_connection(receive)
    if reply.error is not None:
        return await _send_json(send, reply.status, encoder.encode(reply.error))
    return await _send_json(send, reply.status, reply.body, b"text/plain")


def _drop_connection(receive) -> None:
    """Abort the TCP connection under this request, as a dying worker process does. ASGI has no message for it:
    this reaches uvicorn's request cycle (whose bound method `receive` is) and aborts its transport, marking the
    cycle disconnected so that uvicorn writes no 500 after it."""
    cycle = receive.__self__
    cycle.transport.abort()
    cycle.disconnected = True


async def _send_json(send, status: int, body: bytes, media: bytes = b"application/json") -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", media)]})
    await send({"type": "http.response.body", "body": body})


async def _send_body(send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


def _tokenizer_reply(path: str, body: bytes) -> list[TokenSpan] | DetokenizeResponse:
    if path == "/detokenize":
        return DetokenizeResponse(" ".join(f"<{token}>" for token in msgspec.json.decode(body)["tokens"]))
    sent = msgspec.json.decode(body)
    text = sent.get("text") or " ".join(m.get("content") or "" for m in sent.get("messages") or [])  # chat: its words
    spans, start = [], 0
    for index, word in enumerate(text.split()):
        start = text.index(word, start)
        spans.append(TokenSpan(id=index, text=word, start=start, stop=start + len(word)))
        start += len(word)
    return spans


async def _disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


@contextlib.contextmanager
def protocol_worker(**options) -> Iterator[ProtocolWorker]:
    """A ProtocolWorker (`options`: its fields) served by uvicorn on a thread of this process."""
    port = free_port()
    worker = ProtocolWorker(f"http://127.0.0.1:{port}", **options)
    server = uvicorn.Server(uvicorn.Config(worker.app(), host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120  # a bound for a start that fails, not a timing: two busy cores
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the protocol worker did not start")
        time.sleep(0.02)
    try:
        yield worker
    finally:
        worker.release.set()
        server.should_exit = True
        thread.join(timeout=10)


@dataclass
class WorkerProcess:
    """A protocol worker in its own process (counted replies)."""

    url: str
    process: subprocess.Popen

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/stats", timeout=10).json()


def worker_command(port: int, model: str = MODEL, token_delay: float = 0.01, token_bytes: int = 4) -> list[str]:
    return [sys.executable, "-m", "testkit.protocol_worker", "--port", str(port), "--model", model,
            "--token-delay", str(token_delay), "--token-bytes", str(token_bytes)]


@contextlib.contextmanager
def worker_process(model: str = MODEL, token_delay: float = 0.01, token_bytes: int = 4,
                   quiet: bool = False) -> Iterator[WorkerProcess]:
    """`python -m testkit.protocol_worker` on a free port; yields it once healthy."""
    port = free_port()
    output = subprocess.DEVNULL if quiet else None
    process = subprocess.Popen(worker_command(port, model, token_delay, token_bytes), cwd=REPO,
                               stdout=output, stderr=output)
    worker = WorkerProcess(f"http://127.0.0.1:{port}", process)
    try:
        wait_for_health(process, worker.url, 180, "the protocol worker")  # imports on a loaded machine
        yield worker
    finally:
        process.terminate()
        process.wait(timeout=30)


@contextlib.contextmanager
def sluice_on_protocol_worker(data_dir: Path, admin_key: str,
                              settings: str = "") -> Iterator[tuple[SluiceServer, ProtocolWorker]]:
    """A real `sluice serve` whose one endpoint, MODEL, is a protocol worker: what a test of the gateway's wire
    needs. `settings`: top-level TOML lines of the config."""
    with protocol_worker() as worker:
        config = (f'{settings}[[models]]\nname = "{MODEL}"\n'
                  f'provisioner = {{ kind = "static", urls = ["{worker.url}"] }}\n')
        with running_sluice(data_dir, config=config, env={"SLUICE_ADMIN_KEY": admin_key}) as server:
            yield server, worker


def main() -> None:
    parser = argparse.ArgumentParser(description="A protocol worker answering counted replies (no model).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--token-delay", type=float, default=0.01)
    parser.add_argument("--token-bytes", type=int, default=4)
    args = parser.parse_args()
    rows = 4096  # as many as the fault tests' and benches' loads hold open at once
    worker = ProtocolWorker(f"http://127.0.0.1:{args.port}", [Reply.counted(args.token_delay, args.token_bytes)],
                            model=args.model, worker_id="stub", max_rows=rows, max_context=4096,
                            free_cache_tokens=1 << 20, vocab_size=49152, record=False)
    # what is loaded by now lives as long as the process: the collector need not walk it (the gateway does the same
    # once started, gateway/cli/draining.py). Walking it cost this stub pauses of 10-25 ms four times a second under
    # the bench's load, noise in the tail of the stub alone and of every gateway measured in front of it
    gc.collect()
    gc.freeze()
    uvicorn.run(worker.app(), host="127.0.0.1", port=args.port, log_level="warning", loop="uvloop", http="httptools",
                backlog=4096)


if __name__ == "__main__":
    main()
