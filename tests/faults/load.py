"""A light load client for the fault tests: raw HTTP/1.1 over asyncio sockets (one connection per request,
`connection: close`), so a thousand streaming clients fit beside the gateway on two cores. It can read
normally, cut the stream after a number of events, read one byte a second, or never read."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass

import msgspec

from testkit.protocol_worker import MODEL


@dataclass
class Outcome:
    status: int = 0
    events: int = 0  # SSE `data:` lines seen (the last one is [DONE])
    done: bool = False  # the stream ended with [DONE]
    cut: bool = False  # this client left mid-stream on purpose
    request_id: str = ""
    error: str = ""
    body: bytes = b""  # the start of the body of an answer other than 200


def completion_request(host: str, port: int, key: str, max_tokens: int | None = None, stream: bool = True) -> bytes:
    body = {"model": MODEL, "prompt": "hello", "stream": stream}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    payload = msgspec.json.encode(body)
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: {host}:{port}\r\nauthorization: Bearer {key}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(payload)}\r\nconnection: close\r\n\r\n")
    return head.encode() + payload


def _head(data: bytes, outcome: Outcome) -> None:
    status_line, _, rest = data.partition(b"\r\n")
    with contextlib.suppress(IndexError, ValueError):
        outcome.status = int(status_line.split()[1])
    for line in rest.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"x-request-id":
            outcome.request_id = value.strip().decode()


async def stream_completion(host: str, port: int, key: str, *, max_tokens: int | None = None,
                            cut_after_events: int | None = None, timeout: float = 120.0) -> Outcome:
    """One streamed completion read as fast as it comes; `cut_after_events` closes the connection once that
    many events arrived."""
    outcome = Outcome()
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(completion_request(host, port, key, max_tokens))
                buffer = b""
                header_end = -1
                while True:
                    chunk = await reader.read(65536)
                    if not chunk:
                        break
                    buffer += chunk
                    if header_end < 0:
                        header_end = buffer.find(b"\r\n\r\n")
                        if header_end < 0:
                            continue
                        _head(buffer[:header_end], outcome)
                    body = buffer[header_end:]
                    outcome.events = body.count(b"data:")
                    if cut_after_events is not None and outcome.events >= cut_after_events:
                        outcome.cut = True
                        writer.transport.abort()
                        return outcome
                outcome.done = b"data: [DONE]" in buffer
                if outcome.status != 200:
                    outcome.body = buffer[header_end + 4:][:600]
            finally:
                writer.close()
    except (OSError, TimeoutError) as exc:
        outcome.error = repr(exc)
    return outcome


async def stalled_client(host: str, port: int, key: str, *, seconds: float, bytes_per_second: int,
                         max_tokens: int | None = None, receive_buffer: int | None = 4096) -> tuple[int, bool]:
    """A client that reads `bytes_per_second` (0: nothing) for `seconds` through a small receive buffer (None:
    the system's), then drains what is left. Returns (bytes read while stalling, whether the server cut the
    stream short)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    read = 0
    try:
        await loop.sock_connect(sock, (host, port))
        await loop.sock_sendall(sock, completion_request(host, port, key, max_tokens))
        deadline = loop.time() + seconds
        while loop.time() < deadline:  # a reset while trickling is the cut too: the drain below sees it
            second = loop.time() + 1.0
            want = bytes_per_second
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                async with asyncio.timeout(1.0):
                    while want > 0:
                        chunk = await loop.sock_recv(sock, want)
                        if not chunk:
                            break
                        read += len(chunk)
                        want -= len(chunk)
            await asyncio.sleep(max(0.0, second - loop.time()))
        tail = b""
        try:
            async with asyncio.timeout(30):
                while chunk := await loop.sock_recv(sock, 65536):
                    tail += chunk
        except (OSError, TimeoutError):
            return read, True
        return read, b"data: [DONE]" not in tail
    finally:
        sock.close()
