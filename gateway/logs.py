"""structlog setup (JSON lines in production) and the request-id / access-log ASGI middleware.

Headers are never logged, so the Authorization header cannot leak into a log line.
"""

from __future__ import annotations

import time
import uuid

import anyio
import structlog

from common.logs import configure_logging  # shared with the workers

__all__ = ["configure_logging", "request_id_middleware", "request_id_of"]

log = structlog.get_logger("gateway")


def request_id_of(connection) -> str:
    """The id `request_id_middleware` gave this request."""
    return connection.scope["state"]["request_id"]


def request_id_middleware(app):
    """Give every request an id (also the ledger's idempotency key), echo it as `x-request-id`."""

    async def middleware(scope, receive, send):
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        request_id = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(request_id=request_id)
        started = time.perf_counter()
        status = 0

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            await send(message)

        try:
            await app(scope, receive, send_with_id)
        finally:
            # whatever path the request took (a stream that never started, a client gone mid-body),
            # its finalizers run once it is over: accounting can never be skipped
            with anyio.CancelScope(shield=True):
                for finalize in scope["state"].get("finalizers", ()):
                    await finalize()
            log.info("http_request", method=scope["method"], path=scope["path"], status=status,
                     duration_ms=round((time.perf_counter() - started) * 1000, 2))

    return middleware
