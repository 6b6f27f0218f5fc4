"""structlog setup (JSON lines in production) and the request-id / access-log ASGI middleware.

Headers are never logged, so the Authorization header cannot leak into a log line; the one exception is a
caller's `X-Request-Id` that passed CLIENT_ID_PATTERN.
"""

from __future__ import annotations

import os
import re
import time

import anyio
import structlog

from common.logs import configure_logging  # shared with the workers

__all__ = ["answer_request_id", "configure_logging", "new_request_id", "outcome_of", "request_id_middleware",
           "request_id_of"]

log = structlog.get_logger("gateway")
# a caller's X-Request-Id we honour: what load balancers and tracing send (UUIDs, hex, ALB-style ids), nothing
# that could break a header, a log line or a CSV cell; anything else is replaced by our own id
CLIENT_ID_PATTERN = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._:=+/-]{0,127}")
OUTCOME = "outcome"


def new_request_id() -> str:
    """32 hex digits: the Unix time in milliseconds (12), then 80 random bits (20), so ids sort by time.

    It is the ledger's unique key: random ids landed each record of a shipped batch on a random page of that
    index, so a 500-record transaction at 20-30k rows wrote 1.2-2.5 MB of index pages where time-ordered ids
    append about 220 KB, and every answer's WAL commit waits behind the fsync of what the database writes."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def request_id_of(connection) -> str:
    """The id `request_id_middleware` gave this request."""
    return connection.scope["state"]["request_id"]


def outcome_of(connection) -> dict:
    """What a generation request's accounting adds to its line: the middleware then writes `request_done`
    (the outcome, tokens, latency, error code) instead of the plain access line, one line per request."""
    return connection.scope["state"].setdefault(OUTCOME, {})


def client_request_id(scope) -> str | None:
    """The caller's own `X-Request-Id`, when it is one we can echo and log safely (CLIENT_ID_PATTERN)."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            return value.decode("latin-1") if CLIENT_ID_PATTERN.fullmatch(value) else None
    return None


def request_id_middleware(app):
    """Give every request an id (also the ledger's idempotency key and the `id` of generation replies), and
    answer `x-request-id`: the caller's own X-Request-Id when it sent a valid one (also logged with each line
    as `client_request_id`, so one id follows the request through the caller's systems and ours), else ours.
    The caller's id is never the ledger key: two requests that send the same one are still two records."""

    async def middleware(scope, receive, send):
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        request_id = new_request_id()
        client_id = client_request_id(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        if client_id is not None:
            structlog.contextvars.bind_contextvars(client_request_id=client_id)
        scope["state"]["answered_request_id"] = (client_id or request_id).encode()
        started = time.perf_counter()
        try:
            await app(scope, receive, send)
        finally:
            # whatever path the request took (a stream that never started, a client gone mid-body),
            # its finalizers run once it is over: accounting can never be skipped. A finalizer returns what is
            # left to await, or None when it had nothing left to do (the usual case: the request finished)
            for finalize in scope["state"].get("finalizers", ()):
                left = finalize()
                if left is not None:
                    with anyio.CancelScope(shield=True):  # shielded only when needed: a scope costs
                        await left
            duration_ms = round((time.perf_counter() - started) * 1000, 2)
            http_status = scope["state"].get("status", 0)  # 0: refused in a middleware, rendered after this
            outcome = scope["state"].get(OUTCOME)
            if outcome:  # a generation request: one line with its accounting (status is the outcome there)
                log.info("request_done", method=scope["method"], path=scope["path"], http_status=http_status,
                         duration_ms=duration_ms, **outcome)
            else:
                log.info("http_request", method=scope["method"], path=scope["path"], status=http_status,
                         duration_ms=duration_ms)

    return middleware


async def answer_request_id(message, scope) -> None:
    """Every response names its request (`x-request-id`). A Litestar `before_send` hook, not the middleware's
    own send: a refusal raised in a middleware (authentication) is rendered outside the middleware stack."""
    if message["type"] == "http.response.start" and "answered_request_id" in scope.get("state", {}):
        scope["state"]["status"] = message["status"]
        message["headers"] = [*message.get("headers", ()), (b"x-request-id", scope["state"]["answered_request_id"])]
