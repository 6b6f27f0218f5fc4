"""What one HTTP request carries from the edge down to the serving layer, and the middleware that closes it.

- The request id: made once per request by the access log (`gateway.edge.access_log`), it is the ledger's
  idempotency key and the `id` of generation replies (`new_request_id`, `request_id_of`).
- The outcome: the fields a generation's accounting adds to the request's one log line (`outcome_of`).
- The request's context (`gateway.serving.context.RequestContext`), registered here by the pipeline with
  `enter`. `request_scope_middleware` closes it once the response is over, however it ended: a response
  sent, an error, a client gone, a task cancelled. Closing hands back what the request still holds and
  settles a request that ended without an outcome; a request the pipeline settled has nothing left to do.

The access log sits outside this middleware and only logs: by the time it writes the line, the outcome is in.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable
from typing import Protocol

import anyio

REQUEST_ID = "request_id"
CLIENT_REQUEST_ID = "client_request_id"  # the caller's own X-Request-Id, when the access log accepted it
OUTCOME = "outcome"
CONTEXT = "request_context"


class Closes(Protocol):
    def close(self, ended_by: BaseException | None) -> Awaitable[None] | None:
        """What is left of the request once its response is over: None, or what to await (shielded)."""


def new_request_id() -> str:
    """32 hex digits: the Unix time in milliseconds (12), then 80 random bits (20), so ids sort by time.

    It is the ledger's unique key: random ids landed each record of a shipped batch on a random page of that
    index, so a 500-record transaction at 20-30k rows wrote 1.2-2.5 MB of index pages where time-ordered ids
    append about 220 KB, and every answer's WAL commit waits behind the fsync of what the database writes."""
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def request_id_of(connection) -> str:
    """The id the access log gave this request (a Litestar `Request`, or anything with an ASGI `scope`)."""
    return connection.scope["state"][REQUEST_ID]


def client_request_id_of(connection) -> str | None:
    """The caller's own X-Request-Id as the access log accepted it (None: it sent none, or one we do not echo)."""
    return connection.scope["state"].get(CLIENT_REQUEST_ID)


def outcome_of(connection) -> dict:
    """What a generation request's accounting adds to its log line: the access log then writes `request_done`
    (the outcome, tokens, latency, error code) instead of the plain access line, one line per request."""
    return connection.scope["state"].setdefault(OUTCOME, {})


def logged_outcome(scope) -> dict | None:
    """The outcome of a request, if it is a generation request (read by the access log)."""
    return scope["state"].get(OUTCOME)


def enter(connection, context: Closes) -> None:
    """Make `context` the request's: `request_scope_middleware` closes it when the request is over."""
    connection.scope["state"][CONTEXT] = context


def request_scope_middleware(app):
    """Close the request's context (if a pipeline entered one) once the app is done with the request, whatever
    ended it. An exception that escaped the app is passed on, so a fault is told from a cancel."""

    async def middleware(scope, receive, send):
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        ended_by: BaseException | None = None
        try:
            await app(scope, receive, send)
        except BaseException as exc:
            ended_by = exc
            raise
        finally:
            context: Closes | None = scope.get("state", {}).get(CONTEXT)
            left = None if context is None else context.close(ended_by)
            if left is not None:  # a shield only when needed: it costs a few per cent of a short request
                with anyio.CancelScope(shield=True):
                    await left

    return middleware


def cancelled(ended_by: BaseException | None) -> bool:
    """Whether a request that ended by `ended_by` (None: by returning) ended as a cancel rather than a fault."""
    return ended_by is None or isinstance(ended_by, asyncio.CancelledError | GeneratorExit)
