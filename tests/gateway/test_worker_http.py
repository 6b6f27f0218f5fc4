"""The worker hop's HTTP client (gateway/replicas/transport.py) against a real socket server that answers the
way a worker can: keep-alive reuse, event lines split anywhere by chunked encoding, answers left unread, a
worker that refuses, goes silent or hangs up mid-answer, and a consumer slower than the worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.replicas import transport as worker_http
from gateway.replicas.transport import HIGH_WATER, WorkerConnectionError, WorkerHTTP
from testkit.servers import free_port


class Worker:
    """A socket server playing the worker's side of HTTP/1.1: each request gets `answer(request_head)`."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.connections = 0
        self.heads: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length"))
                await reader.readexactly(length)
                self.heads.append(head)
                await self.answer(writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def chunked(*pieces: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


STREAM_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-ndjson\r\ntransfer-encoding: chunked\r\n\r\n"


async def split_events(writer: asyncio.StreamWriter) -> None:
    writer.write(STREAM_HEAD)
    for piece in (b'{"a":', b'1}\n{"b"', b':2}\n\n{"c":3}'):  # a line across pieces, an empty one, no final newline
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        await writer.drain()
        await asyncio.sleep(0.01)
    writer.write(b"0\r\n\r\n")


async def lines_of(response) -> AsyncIterator[bytes]:
    """The body's lines one by one, as `next_lines` hands them over."""
    while (lines := await response.next_lines()) is not None:
        for line in lines:
            yield line


async def read_lines(worker: WorkerHTTP) -> list[bytes]:
    async with worker.post("/generate", b'{"x":1}') as response:
        assert response.status_code == 200
        return [line async for line in lines_of(response)]


async def test_lines_split_anywhere_arrive_whole_and_the_connection_is_reused():
    server = Worker(split_events)
    async with server as url:
        worker = WorkerHTTP(url, {"x-sluice-worker-secret": "s3cret"}, read_timeout=5)
        assert await read_lines(worker) == [b'{"a":1}', b'{"b":2}', b"", b'{"c":3}']
        assert await read_lines(worker) == [b'{"a":1}', b'{"b":2}', b"", b'{"c":3}']
        await worker.aclose()
    assert server.connections == 1
    head = server.heads[0].decode()
    assert head.startswith("POST /generate HTTP/1.1\r\n")
    assert "x-sluice-worker-secret: s3cret\r\n" in head and "content-length: 7\r\n" in head


async def test_blocks_hold_whole_lines_and_take_all_that_arrived():
    """`next_block`: every whole line that arrived, newlines kept (a line split across pieces waits for its end, a
    last one without a newline gets one); all that was buffered at once, so the next call waits for the socket."""
    async def burst(writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (b'{"a":', b"1}\n", b'{"b":2}\n')))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(chunked(b'{"c"', b":3}"))

    for answer, expected in ((split_events, b'{"a":1}\n{"b":2}\n\n{"c":3}\n'), (burst, b'{"a":1}\n{"b":2}\n{"c":3}\n')):
        async with Worker(answer) as url:
            worker = WorkerHTTP(url, {}, read_timeout=5)
            async with worker.post("/generate", b"{}") as response:
                blocks = []
                while (block := await response.next_block()) is not None:
                    blocks.append(block)
            await worker.aclose()
        assert b"".join(blocks) == expected
        assert all(block.endswith(b"\n") for block in blocks if block)
    assert blocks[0] == b'{"a":1}\n{"b":2}\n'  # the burst's three pieces at once


async def test_an_answer_left_unread_closes_its_connection_and_a_refusal_is_read_whole():
    async def refuse(writer: asyncio.StreamWriter) -> None:
        body = b'{"kind":"overloaded","message":"busy"}'
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))

    server = Worker(split_events)
    async with server as url:
        worker = WorkerHTTP(url, {}, read_timeout=5)
        async with worker.post("/generate", b"{}") as response:
            async for _ in lines_of(response):
                break  # the client went away after the first event
        assert await read_lines(worker) == [b'{"a":1}', b'{"b":2}', b"", b'{"c":3}']
        assert server.connections == 2
        server.answer = refuse
        async with worker.post("/generate", b"{}") as response:
            assert (response.status_code, await response.aread()) == (503, b'{"kind":"overloaded","message":"busy"}')
        async with worker.post("/generate", b"{}") as response:  # a complete refusal keeps its connection
            assert response.status_code == 503
            await response.aread()
        await worker.aclose()
    assert server.connections == 2


async def test_a_refused_connection_is_a_connection_error():
    worker = WorkerHTTP(f"http://127.0.0.1:{free_port()}", {}, read_timeout=5)
    with pytest.raises(WorkerConnectionError, match="cannot connect"):
        async with worker.post("/generate", b"{}"):
            pass


async def test_a_silent_worker_is_a_connection_error_after_the_read_timeout():
    async def silent(writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD + b"8\r\n{\"a\":1}\n\r\n")  # one event, then nothing

    async with Worker(silent) as url:
        worker = WorkerHTTP(url, {}, read_timeout=1.0)
        lines = []
        with pytest.raises(WorkerConnectionError, match="read timeout"):
            async with worker.post("/generate", b"{}") as response:
                async for line in lines_of(response):
                    lines.append(line)
        assert lines == [b'{"a":1}']
        await worker.aclose()


async def test_a_worker_that_hangs_up_mid_answer_or_before_it_is_a_connection_error():
    async def hang_up(writer: asyncio.StreamWriter) -> None:
        writer.write(STREAM_HEAD + b"8\r\n{\"a\":1}\n\r\n")
        writer.close()

    async def hang_up_at_once(writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = Worker(hang_up)
    async with server as url:
        worker = WorkerHTTP(url, {}, read_timeout=5)
        with pytest.raises(WorkerConnectionError, match="mid-answer"):
            await read_lines(worker)
        server.answer = hang_up_at_once
        with pytest.raises(WorkerConnectionError, match="before answering"):
            await read_lines(worker)
        await worker.aclose()


async def test_an_idle_connection_past_its_expiry_is_not_reused(monkeypatch):
    monkeypatch.setattr(worker_http, "KEEPALIVE_EXPIRY_S", 0.0)
    server = Worker(split_events)
    async with server as url:
        worker = WorkerHTTP(url, {}, read_timeout=5)
        await read_lines(worker)
        await read_lines(worker)
        await worker.aclose()
    assert server.connections == 2


async def test_a_slow_consumer_stops_the_reads_instead_of_buffering_the_answer():
    line = b"x" * 1023 + b"\n"

    async def flood(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (4096 * len(line)))
        for _ in range(64):
            writer.write(line * 64)
            await writer.drain()

    async with Worker(flood) as url:
        worker = WorkerHTTP(url, {}, read_timeout=5)
        most = count = 0
        async with worker.post("/generate", b"{}") as response:
            async for _ in lines_of(response):
                if count == 0:
                    await asyncio.sleep(0.3)  # the worker writes on meanwhile
                count += 1
                most = max(most, response._connection.buffered)
        await worker.aclose()
    assert count == 4096
    assert most <= 2 * HIGH_WATER  # one read past the mark at most: the rest of the 4 MiB waited in the kernel
