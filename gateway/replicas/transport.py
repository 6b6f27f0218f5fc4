"""The gateway's one HTTP/1.1 client for a worker: every call to a replica goes over its `WorkerHTTP` (one per
replica, made by gateway/replicas/pool.py): `POST /generate` and its NDJSON event lines, the one-answer calls
(`/tokenize`, `/detokenize`, ...) and the health polls (`GET /load`, `/info`).

Why not httpx here: under load its pool bookkeeping, stream wrappers and line iteration cost the event loop
more than the rest of the request. This client does the one thing the hop needs on persistent
connections: an asyncio Protocol per connection, httptools (uvicorn's parser) for the response, one write
per request, body lines handed over as they arrive. Connections idle longer than `KEEPALIVE_EXPIRY_S` are
dropped before reuse, well inside the worker's own keep-alive timeout (uvicorn: 5 s): a request sent on a
connection the worker is closing would fail before any answer and read as an unreachable worker.

Every failure to reach or hear the worker (refused, reset, closed early, a read or connect timeout) is a
`WorkerConnectionError` (a timeout the `WorkerTimeout` kind of it: a poll tolerates a few); statuses and bodies
are the caller's to judge (gateway/replicas/relay.py).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from urllib.parse import urlsplit

import httptools

KEEPALIVE_EXPIRY_S = 2.0
MAX_IDLE = 256  # connections kept per replica; more in flight are closed when done
CONNECT_TIMEOUT_S = 10.0
HIGH_WATER = 256 * 1024  # bytes read ahead of a slow consumer before the worker's socket stops being read


class WorkerConnectionError(Exception):
    """The worker could not be reached, or the connection broke or went silent before the answer ended."""


class WorkerTimeout(WorkerConnectionError):
    """The worker did not connect, or sent nothing, within the call's timeout."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one response at a time."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.complete = False
        self.keep_alive = False  # read when the answer completes: the parser forgets it after
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.paused = False
        self.waiter: asyncio.Future | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.lost = True
            self.transport.close()
        if self.buffered > HIGH_WATER and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._wake()

    # httptools callbacks
    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.lost and not self.transport.is_closing()

    async def wait(self, timeout: float) -> None:
        """Until more of the response arrived (headers, body, its end) or the connection was lost."""
        loop = asyncio.get_running_loop()
        self.waiter = loop.create_future()
        timer = loop.call_later(timeout, self._expire)
        try:
            await self.waiter
        finally:
            timer.cancel()
            self.waiter = None

    def _expire(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(WorkerTimeout("the worker sent nothing within the read timeout"))

    async def status_line(self, timeout: float) -> int:
        while not self.status:
            if self.lost:
                raise WorkerConnectionError("the worker closed the connection before answering")
            await self.wait(timeout)
        return self.status

    async def chunk(self, timeout: float) -> bytes | None:
        """The next piece of the body; None at its end."""
        while not self.chunks:
            if self.complete:
                return None
            if self.lost:
                raise WorkerConnectionError("the worker closed the connection mid-answer")
            await self.wait(timeout)
        data = self.chunks.popleft()
        self.buffered -= len(data)
        self._resume()
        return data

    def drain(self) -> list[bytes]:
        """The pieces of the body that arrived already, taken at once (perhaps none)."""
        chunks, self.chunks, self.buffered = list(self.chunks), deque(), 0
        self._resume()
        return chunks

    def _resume(self) -> None:
        if self.paused and self.buffered <= HIGH_WATER // 2:
            self.paused = False
            self.transport.resume_reading()


class WorkerResponse:
    """A worker's answer while it streams: its status, then its body whole or line by line."""

    def __init__(self, connection: _Connection, status: int, read_timeout: float) -> None:
        self._connection = connection
        self.status_code = status
        self._read_timeout = read_timeout
        self._rest = b""  # a line begun but not yet ended

    async def aread(self) -> bytes:
        parts = []
        while (data := await self._connection.chunk(self._read_timeout)) is not None:
            parts.append(data)
        return b"".join(parts)

    async def next_lines(self) -> list[bytes] | None:
        """The lines (without their newlines) that the next piece of the body completed, perhaps none; None
        once the body ended (a last line without a newline comes before that). A list per read, not a line per
        step of a generator: the events of a short answer mostly arrive together."""
        data = await self._connection.chunk(self._read_timeout)
        if data is None:
            rest, self._rest = self._rest, b""
            return [rest] if rest else None
        if self._rest:
            data = self._rest + data
        *complete, self._rest = data.split(b"\n")
        return complete

    async def next_block(self) -> bytes | None:
        """Every whole line that arrived by the next read, as one piece (each line with its newline; perhaps
        b""); None once the body ended (a last line without a newline comes before that, one added). For a
        consumer that would rather not cut the lines apart (gateway/replicas/token_lines.py): what arrived in a
        burst comes at once, not a read's piece at a time."""
        data = await self._connection.chunk(self._read_timeout)
        if data is None:
            rest, self._rest = self._rest, b""
            return rest + b"\n" if rest else None
        data = b"".join([self._rest, data, *self._connection.drain()])
        end = data.rfind(b"\n") + 1
        if end == len(data):  # the common case: the worker writes whole lines
            self._rest = b""
            return data
        self._rest = data[end:]
        return data[:end]


class _Exchange:
    """One request and its answer on a pooled connection (`WorkerHTTP.post`, `.get`); a class, not a
    generator-based context manager: it runs once per generation request."""

    __slots__ = ("_client", "_connection", "_request", "_timeout")

    def __init__(self, client: WorkerHTTP, request: bytes, timeout: float) -> None:
        self._client, self._request, self._timeout = client, request, timeout
        self._connection: _Connection | None = None

    async def __aenter__(self) -> WorkerResponse:
        connection = self._connection = await self._client._checkout(min(self._timeout, CONNECT_TIMEOUT_S))
        connection.transport.write(self._request)
        try:
            status = await connection.status_line(self._timeout)
        except BaseException:
            connection.transport.close()
            raise
        return WorkerResponse(connection, status, self._timeout)

    async def __aexit__(self, kind, error, traceback) -> None:
        if kind is None:
            self._client._checkin(self._connection)
        else:
            self._connection.transport.close()


class WorkerHTTP:
    """Persistent connections to one worker, for every call to it: `POST`s whose answers may stream, `GET`s."""

    def __init__(self, url: str, headers: dict[str, str], read_timeout: float) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.tls = parts.scheme == "https"
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        self.read_timeout = read_timeout
        self.headers = headers  # sent with every call (the worker secret)
        host = parts.netloc.rsplit("@", 1)[-1]
        self._head = "".join(f"{name}: {value}\r\n" for name, value in {"host": host, **headers}.items())
        self._idle: list[_Connection] = []
        self._heads: dict[tuple[str, str], bytes] = {}  # the request line and fixed headers per (path, type)
        self._ssl = ssl.create_default_context() if self.tls else None
        self._closed = False

    def post(self, path: str, body: bytes, content_type: str = "application/json",
             timeout: float | None = None) -> _Exchange:
        """`async with worker.post(path, body) as response`: the connection goes back to the pool only if its
        answer was read to the end; leaving early (a client gone, an error) closes it. `timeout`: for the
        connection and each read (default: `read_timeout`, and at most CONNECT_TIMEOUT_S to connect)."""
        head = self._heads.get((path, content_type))
        if head is None:
            head = self._heads[(path, content_type)] = (
                f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head}content-type: {content_type}\r\n"
                "content-length: ").encode("latin-1")
        return _Exchange(self, head + b"%d\r\n\r\n" % len(body) + body, timeout or self.read_timeout)

    def get(self, path: str, timeout: float | None = None) -> _Exchange:
        """`async with worker.get(path, timeout=2.0) as response`, as `post` without a body (the polls)."""
        return _Exchange(self, f"GET {self.prefix}{path} HTTP/1.1\r\n{self._head}\r\n".encode("latin-1"),
                         timeout or self.read_timeout)

    async def _checkout(self, connect_timeout: float = CONNECT_TIMEOUT_S) -> _Connection:
        now = time.monotonic()
        while self._idle:
            connection = self._idle.pop()
            if not connection.lost and not connection.transport.is_closing() \
                    and now - connection.idle_since < KEEPALIVE_EXPIRY_S:
                connection._reset()
                return connection
            connection.transport.close()
        if self._closed:
            raise WorkerConnectionError("the worker's client is closed")
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(_Connection, self.host, self.port, ssl=self._ssl), connect_timeout)
        except TimeoutError as exc:
            raise WorkerTimeout(f"cannot connect to {self.host}:{self.port} in {connect_timeout} s") from exc
        except OSError as exc:
            raise WorkerConnectionError(f"cannot connect to {self.host}:{self.port} ({exc!r})") from exc
        return connection

    def _checkin(self, connection: _Connection) -> None:
        if connection.reusable and not self._closed and len(self._idle) < MAX_IDLE:
            connection.idle_since = time.monotonic()
            self._idle.append(connection)
        else:
            connection.transport.close()

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            self._idle.pop().transport.close()
