"""A stub worker that plays the worker protocol over real HTTP/1.1 (a protocol stub, not our worker):
`/load` and `/info` answer ready; `/generate` streams NDJSON events, or fails the way `mode` says,
including a connection dropped mid-stream, which a real worker does only when it dies."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec

from common.protocol import Accepted, Done, Error, Finish, ModelInfo, Token, WorkerLoad, encode_event

TOKENS = 5


class StubWorker:
    """Modes: ok | refuse (close at once) | unavailable (503 + Error) | bare_502 | overloaded (429 + Error)
    | internal_event (200, then an internal Error event) | drop_after:<k> (k tokens, then the connection dies)
    | hold (streams one token, then waits for `release`)."""

    def __init__(self, name: str = "stub"):
        self.name = name
        self.mode = "ok"
        self.generate_calls = 0
        self.release = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> StubWorker:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                length = 0
                while (header := await reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                if not await self._answer(method, path, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _answer(self, method: str, path: str, writer: asyncio.StreamWriter) -> bool:
        """False: the connection is finished (closed or aborted)."""
        if path == "/load":
            return await _json(writer, 200, WorkerLoad(ready=True, model=self.name, queued=0, running_rows=0,
                                                        max_rows=8, free_cache_tokens=1000, worker_id=self.name))
        if path == "/info":
            return await _json(writer, 200, ModelInfo(model_id=self.name, model_dtype="float32", device="cpu",
                                                      quantization="none", max_context=64, max_rows=8,
                                                      vocab_size=8, eos_token_ids=[0], worker_id=self.name))
        self.generate_calls += 1
        mode = self.mode
        if mode == "refuse":
            writer.transport.abort()
            return False
        if mode == "unavailable":
            return await _json(writer, 503, Error(kind="unavailable", message="stub is down"))
        if mode == "overloaded":
            return await _json(writer, 429, Error(kind="overloaded", message="stub is full"))
        if mode == "bare_502":
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 3\r\n\r\nbad")
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n")
        if mode == "internal_event":
            await _chunk(writer, encode_event(Error(kind="internal", message="stub broke")))
            await _chunk(writer, b"")
            return True
        await _chunk(writer, encode_event(Accepted(prompt_tokens=1, prompt_ids=[1], seeds=[0], worker_id=self.name)))
        drop_after = int(mode.split(":")[1]) if mode.startswith("drop_after:") else None
        for index in range(TOKENS):
            if index == drop_after:
                writer.transport.abort()  # the worker died mid-stream
                return False
            await _chunk(writer, encode_event(Token(index=0, token_id=2 + index, text=f"t{index} ")))
            if mode == "hold" and index == 0:
                await self.release.wait()
        text = "".join(f"t{i} " for i in range(TOKENS))
        await _chunk(writer, encode_event(Finish(index=0, reason="length", text=text,
                                                 token_ids=list(range(2, 2 + TOKENS)), seed=0)))
        await _chunk(writer, encode_event(Done(prompt_tokens=1, completion_tokens=TOKENS, compute_tokens=TOKENS,
                                               worker_id=self.name)))
        await _chunk(writer, b"")
        return True


async def _json(writer: asyncio.StreamWriter, status: int, body: msgspec.Struct) -> bool:
    data = msgspec.json.encode(body)
    writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
                 .encode() + data)
    await writer.drain()
    return True


async def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()
