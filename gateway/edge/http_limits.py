"""Bounds on what one HTTP connection may hold before the app sees a request (the `[http]` settings).

uvicorn's httptools protocol buffers a request head of any size and waits for it forever: it arms no timer
before the first answer, and its keep-alive timer stops at the first byte of the next request. Here a subclass
of it (`edge_protocol`, what `sluice serve` runs) adds:
- `max_header_bytes`: a request line plus headers over it gets 431. The count is of the bytes received while
  a head is being read, so the parser never holds more than the bound plus one read, however long the header;
  a head that completes inside a larger read is measured exactly before it is refused.
- `header_timeout_s`: a connection that has not sent a complete head this long after it opened (or after the
  first byte of its next request) is closed, with a 408 when part of a request came.
- `body_timeout_s`: the body must arrive within this long after its head (408, the app sees a disconnect). A
  streamed body (POST to one of `streamed_paths`: the file upload, which reads its body as it comes and bounds
  its own length and time) must instead never stall this long, and counts against the body shares below only
  what waits for the app to read it.
- `keep_alive_timeout_s`: uvicorn's own idle timer between requests, from these settings.
- per client (gateway/edge/client_shares.py: the peer, or the client a trusted proxy forwards for; IPv6 by
  /64): `max_connections_per_client` open connections, or requests in progress behind a trusted proxy (429
  `too_many_connections`); `max_buffered_body_bytes_per_client` of bodies not yet complete, and
  `max_buffered_body_bytes` in all (429 `body_buffer_full`, the app hears a disconnect).
Deadlines are checked by one sweep of the process's connections every `SWEEP_S`, so a request costs a clock read
and a stored float per phase (about 1-2 us over plain httptools), not a timer set and cancelled per phase; a
deadline holds to within `SWEEP_S`. The per-client counts are per gateway process.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import structlog
from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from auth.forwarded import ClientAddresses, client_group
from common.errors import SluiceError
from gateway.config import HttpSettings
from gateway.edge.client_shares import ClientShares
from gateway.metrics import REGISTRY
from gateway.serving.dialect import openai_envelope

log = structlog.get_logger("gateway")
SWEEP_S = 0.25
HEAD_FRAMING = 4  # ": " and CRLF around each header, counted in the exact size of a head
REASONS = ("too_many_connections", "header_too_large", "header_timeout", "body_timeout", "body_buffer_full")
REFUSED = Counter("sluice_http_refused", "Connections and requests the HTTP edge refused or cut, by reason",
                  ("reason",), registry=REGISTRY)
_refused = {reason: REFUSED.labels(reason) for reason in REASONS}


class HeaderTooLarge(SluiceError):
    status, type, code = 431, "invalid_request_error", "header_too_large"


class ReadTimedOut(SluiceError):
    status, type = 408, "timeout"


class TooManyConnections(SluiceError):
    status, type, code = 429, "rate_limit_exceeded", "too_many_connections"


class BodyBufferFull(SluiceError):
    status, type, code = 429, "rate_limit_exceeded", "body_buffer_full"


def _answer(error: SluiceError) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and body of a refusal in the OpenAI envelope (no dialect is known before a request is read);
    every one closes its connection."""
    body = msgspec.json.encode(openai_envelope(error))
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    headers += [(name.encode(), value.encode()) for name, value in error.response_headers().items()]
    return headers, body


def _raw(status: int, answer: tuple[list[tuple[bytes, bytes]], bytes]) -> bytes:
    headers, body = answer
    return STATUS_LINE[status] + b"".join(name + b": " + value + b"\r\n" for name, value in headers) + b"\r\n" + body


def _asgi_answer(status: int, answer: tuple[list[tuple[bytes, bytes]], bytes]) -> Any:
    """An ASGI app that answers `answer` whatever the request: a refusal decided once the head is read."""
    headers, body = answer

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    return app


def _forwarded_for(headers: list[tuple[bytes, bytes]]) -> list[str]:
    return [value.decode("latin-1") for name, value in headers if name == b"x-forwarded-for"]


def edge_protocol(limits: HttpSettings, trusted_proxies: list[str],
                  streamed_paths: frozenset[bytes] = frozenset()) -> type[HttpToolsProtocol]:
    """The protocol class for `uvicorn.Config(http=...)`: one per server, holding its per-client counts."""
    clients = ClientAddresses(trusted_proxies)
    cap = limits.max_connections_per_client
    shares = ClientShares(cap, limits.max_buffered_body_bytes, limits.max_buffered_body_bytes_per_client)
    too_large = _answer(HeaderTooLarge(f"The request line and headers exceed max_header_bytes "
                                       f"({limits.max_header_bytes} bytes)."))
    too_many = _answer(TooManyConnections(
        f"This client has max_connections_per_client ({cap}) connections or requests open; close one or reuse it."))
    refusals = {
        "header_too_large": _raw(431, too_large),
        "header_timeout": _raw(408, _answer(ReadTimedOut(
            f"The request headers did not arrive within header_timeout_s ({limits.header_timeout_s:g} s).",
            code="header_timeout"))),
        "body_timeout": _raw(408, _answer(ReadTimedOut(
            f"The request body did not arrive within body_timeout_s ({limits.body_timeout_s:g} s).",
            code="body_timeout"))),
        "too_many_connections": _raw(429, too_many),
        "body_buffer_full": _raw(429, _answer(BodyBufferFull(
            "The gateway holds as many unfinished request bodies as it may for this client or in all "
            "(max_buffered_body_bytes_per_client, max_buffered_body_bytes); send the body at once and retry."))),
    }
    answer_too_large = _asgi_answer(431, too_large)
    answer_too_many = _asgi_answer(429, too_many)

    class EdgeProtocol(HttpToolsProtocol):
        _sweeping = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._slot: str | None = None  # the client whose connection slot this connection holds
            self._request_slots: list[str] = []  # behind a trusted proxy: the clients of its requests in progress
            self._client = ""  # whom the current request's body is counted for
            self.body_held = 0
            self._streamed = False  # the current request's body is read by the app as it comes
            self._head_bytes = 0
            self._reading_head = True
            self._deadline = self.loop.time() + limits.header_timeout_s
            self._deadline_reason = "header_timeout"
            if not EdgeProtocol._sweeping:
                EdgeProtocol._sweeping = True
                self.loop.call_later(SWEEP_S, _sweep, self.loop, self.connections)
            address = self.client[0] if self.client else None
            self._proxied = address is not None and clients.trusted(address)
            self._client = client_group(address) if address is not None else "unknown"
            if address is not None and not self._proxied:
                if not shares.take_slot(self._client):
                    self._refuse("too_many_connections")
                    return
                self._slot = self._client

        def connection_lost(self, exc: Exception | None) -> None:
            self._deadline = 0.0
            shares.release(self, self._client)
            if self._slot is not None:
                shares.give_slot(self._slot)
                self._slot = None
            for client in self._request_slots:
                shares.give_slot(client)
            self._request_slots.clear()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._reading_head:
                self._head_bytes += len(data)
            super().data_received(data)
            if self._reading_head and self._head_bytes > limits.max_header_bytes and not self.transport.is_closing():
                self._refuse("header_too_large")  # a head still incomplete past the bound: never buffer more

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if not self._deadline:  # the first request's clock runs from the connection's start
                self._deadline = self.loop.time() + limits.header_timeout_s
                self._deadline_reason = "header_timeout"

        def on_headers_complete(self) -> None:
            self._reading_head = False
            self._streamed = bool(streamed_paths) and (self.parser.get_method() == b"POST"
                              and self.url.split(b"?", 1)[0] in streamed_paths)
            self._deadline = self.loop.time() + limits.body_timeout_s
            self._deadline_reason = "body_timeout"
            if self._head_bytes > limits.max_header_bytes and self._exact_head_bytes() > limits.max_header_bytes:
                _refused["header_too_large"].inc()
                self._start_refused(answer_too_large)
                return
            if self._proxied:  # one address carries every client: count this request for the client it names
                self._client = client_group(clients.client(self.client[0], _forwarded_for(self.headers)))
                if not shares.take_slot(self._client):
                    _refused["too_many_connections"].inc()
                    self._start_refused(answer_too_many)
                    return
                self._request_slots.append(self._client)
            super().on_headers_complete()

        def _start_refused(self, app: Any) -> None:
            """Start this request's cycle with `app` (an answer that closes the connection) instead of the app."""
            own, self.app = self.app, app
            try:
                super().on_headers_complete()
            finally:
                self.app = own

        def on_body(self, body: bytes) -> None:
            super().on_body(body)
            cycle = self.cycle
            if cycle.response_complete or cycle.disconnected or self.transport.is_closing():
                return
            if self._streamed:  # only what the app has not read yet; the clock runs from the last bytes
                shares.set_held(self, self._client, len(cycle.body))
                self._deadline = self.loop.time() + limits.body_timeout_s
            else:
                shares.hold(self, self._client, len(body))
            while (newest := shares.over_share(self._client)) is not None:  # the client's newest body goes first
                newest._cut_body("body_buffer_full")
            while shares.over_total():  # evict the largest holder of the largest client, this one or another
                victim = shares.largest_holder()
                if victim is None:
                    break
                victim._cut_body("body_buffer_full")

        def on_message_complete(self) -> None:
            shares.release(self, self._client)  # a whole body: the app's to read, no longer stalled
            self._reading_head = True
            self._head_bytes = 0
            self._deadline = 0.0
            super().on_message_complete()

        def on_response_complete(self) -> None:
            if self._request_slots:
                shares.give_slot(self._request_slots.pop(0))
            if self.cycle is not None and self.cycle.response_complete:
                shares.release(self, self._client)  # answered without its body: uvicorn drops the rest
            super().on_response_complete()

        def _exact_head_bytes(self) -> int:
            return len(self.url) + sum(len(name) + len(value) + HEAD_FRAMING for name, value in self.headers)

        def _refuse(self, reason: str) -> None:
            """Answer `reason` and close; behind an answer still being sent (pipelining), close only."""
            _refused[reason].inc()
            self._deadline = 0.0
            cycle = self.cycle
            if cycle is None or cycle.response_complete or cycle.disconnected:
                self.transport.write(refusals[reason])
            self.transport.close()

        def _cut_body(self, reason: str) -> None:
            """Stop reading a body that came too slowly or holds too much: the app hears a disconnect, the client
            gets `reason` (unless an answer was begun), the connection closes."""
            shares.release(self, self._client)
            self._deadline = 0.0
            cycle = self.cycle
            if self.transport.is_closing():
                return
            if cycle is None or cycle.response_started:  # answered already (without reading the body): cut
                _refused[reason].inc()
                self.transport.close()
                return
            cycle.body = bytearray()  # what the app has not taken yet is dropped now
            cycle.disconnected = True  # the app hears a disconnect, and whatever it sends is dropped
            cycle.message_event.set()
            self._refuse(reason)

        def expire(self) -> None:
            """Its deadline passed: a head or a body that did not arrive in time."""
            reason, cycle = self._deadline_reason, self.cycle
            self._deadline = 0.0
            if self.transport.is_closing():
                return
            if reason == "body_timeout":
                self._cut_body(reason)
            elif cycle is not None and not cycle.response_complete:
                cycle.keep_alive = False  # a pipelined head stalled behind an answer: close once it is sent
            elif self._head_bytes:
                self._refuse(reason)
            else:  # nothing of a request came: close without an answer nobody asked for
                _refused[reason].inc()
                self.transport.close()

    return EdgeProtocol


def _sweep(loop: asyncio.AbstractEventLoop, connections: set) -> None:
    loop.call_later(SWEEP_S, _sweep, loop, connections)  # first: whatever one connection does, the sweeps go on
    now = loop.time()
    for connection in list(connections):
        deadline = connection._deadline
        if deadline and deadline <= now:
            try:
                connection.expire()
            except Exception:  # noqa: BLE001 - one connection's failure must not spare the others
                log.exception("http_expire_failed")
                connection.transport.abort()
