"""structlog setup (JSON lines in production) and the access-log ASGI middleware: every request gets its id and
one log line when it is over. It only logs: what a generation request holds is settled by the request scope
inside it (`gateway.serving.request_scope`), so its line carries the outcome.

Headers are never logged, so the Authorization header cannot leak into a log line; the one exception is a
caller's `X-Request-Id` that passed CLIENT_ID_PATTERN.
"""

from __future__ import annotations

import re
import time

import structlog

from common.logs import configure_logging  # shared with the workers
from gateway.serving.request_scope import CLIENT_REQUEST_ID, REQUEST_ID, logged_outcome, new_request_id

__all__ = ["access_log_middleware", "answer_request_id", "configure_logging"]

log = structlog.get_logger("gateway")
# a caller's X-Request-Id we honour: what load balancers and tracing send (UUIDs, hex, ALB-style ids), nothing
# that could break a header, a log line or a CSV cell; anything else is replaced by our own id
CLIENT_ID_PATTERN = re.compile(rb"[A-Za-z0-9][A-Za-z0-9._:=+/-]{0,127}")


def client_request_id(scope) -> str | None:
    """The caller's own `X-Request-Id`, when it is one we can echo and log safely (CLIENT_ID_PATTERN)."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            return value.decode("latin-1") if CLIENT_ID_PATTERN.fullmatch(value) else None
    return None


def access_log_middleware(app):
    """Give every request an id (also the ledger's idempotency key and the `id` of generation replies), and
    answer `x-request-id`: the caller's own X-Request-Id when it sent a valid one (also logged with each line
    as `client_request_id`, so one id follows the request through the caller's systems and ours), else ours.
    The caller's id is never the ledger key: two requests that send the same one are still two records. Once the
    request is over, write its one line."""

    async def middleware(scope, receive, send):
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        request_id = new_request_id()
        client_id = client_request_id(scope)
        scope.setdefault("state", {})[REQUEST_ID] = request_id
        scope["state"][CLIENT_REQUEST_ID] = client_id  # the ledger keeps it beside ours: support finds either
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        if client_id is not None:
            structlog.contextvars.bind_contextvars(client_request_id=client_id)
        scope["state"]["answered_request_id"] = (client_id or request_id).encode()
        started = time.perf_counter()
        try:
            await app(scope, receive, send)
        finally:
            duration_ms = round((time.perf_counter() - started) * 1000, 2)
            http_status = scope["state"].get("status", 0)  # 0: refused in a middleware, rendered after this
            outcome = logged_outcome(scope)
            if outcome:  # a generation request: one line with its accounting (status is the outcome there)
                log.info("request_done", method=scope["method"], path=scope["path"], http_status=http_status,
                         duration_ms=duration_ms, **outcome)
            else:
                log.info("http_request", method=scope["method"], path=scope["path"], status=http_status,
                         duration_ms=duration_ms)

    return middleware


async def answer_request_id(message, scope) -> None:
    """Every response names its request: `x-request-id`, and `request-id`, the header Anthropic answers with and its
    SDKs read (`_request_id`). A Litestar `before_send` hook, not the middleware's own send: a refusal raised in a
    middleware (authentication) is rendered outside the middleware stack."""
    if message["type"] == "http.response.start" and "answered_request_id" in scope.get("state", {}):
        scope["state"]["status"] = message["status"]
        request_id = scope["state"]["answered_request_id"]
        message["headers"] = [*message.get("headers", ()), (b"x-request-id", request_id), (b"request-id", request_id)]
