"""A light load client for the fault tests: raw HTTP/1.1 over asyncio sockets (one connection per request,
`connection: close`), so a thousand streaming clients fit beside the gateway on two cores. It can read
normally, cut the stream after a number of events, read one byte a second, or never read."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from dataclasses import dataclass

import msgspec

MODEL = "stub-model"


@dataclass
class Outcome:
    status: int = 0
    events: int = 0  # SSE `data:` lines seen (the last one is [DONE])
    done: bool = False  # the stream ended with [DONE]
    cut: bool = False  # this client left mid-stream on purpose
    request_id: str = ""
    error: str = ""


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
            finally:
                writer.close()
    except (OSError, TimeoutError) as exc:
        outcome.error = repr(exc)
    return outcome


async def stalled_client(host: str, port: int, key: str, *, seconds: float, byte_per_second: bool,
                         max_tokens: int | None = None) -> tuple[int, bool]:
    """A client with a 4 KiB receive buffer that reads one byte a second (`byte_per_second`) or nothing for
    `seconds`; then drains what is left. Returns (bytes read while stalling, whether the server cut the
    connection before the stream ended)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    read = 0
    try:
        await loop.sock_connect(sock, (host, port))
        await loop.sock_sendall(sock, completion_request(host, port, key, max_tokens))
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            if byte_per_second:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        read += len(await loop.sock_recv(sock, 1))
            await asyncio.sleep(1.0)
        tail = b""
        try:
            async with asyncio.timeout(30):
                while chunk := await loop.sock_recv(sock, 65536):
                    tail += chunk
        except (ConnectionResetError, TimeoutError):
            return read, True
        return read, b"data: [DONE]" not in tail
    finally:
        sock.close()
