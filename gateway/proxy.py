"""Send a GenerateRequest to a replica of its model and relay the worker's events.

Replicas are tried least-loaded first. A request moves on to the next replica when the worker is
unreachable, overloaded, or fails before it produced a token; once a token was relayed the client
has seen output, so a broken connection becomes an error instead of a silent retry. A worker's `Error`
event is raised as the gateway's error, before the first token (a real status) or mid-stream (the
dialect's stream error), never passed on as an event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import msgspec
import structlog

from common.protocol import Accepted, Error, Event, GenerateRequest, decode_event
from gateway.errors import (
    DeadlineExceeded,
    NotFound,
    Overloaded,
    SluiceError,
    Unavailable,
    UpstreamFailed,
    ValidationFailed,
)
from gateway.routing.pool import ModelPool

log = structlog.get_logger("gateway")
RETRYABLE_KINDS = {"overloaded", "unavailable", "internal", "unauthorized"}  # not "timeout": the deadline passed


def worker_error(error: Error) -> SluiceError:
    """Map a worker `Error` event to the gateway's error hierarchy."""
    if error.kind in ("validation", "too_long"):
        return ValidationFailed(error.message, param=error.field,
                                code="context_length_exceeded" if error.kind == "too_long" else None)
    if error.kind == "not_found":
        return NotFound(error.message)
    if error.kind == "overloaded":
        return Overloaded(error.message)
    if error.kind == "timeout":
        return DeadlineExceeded(error.message)
    if error.kind == "unauthorized":  # our configuration, not the client's key: SLUICE_WORKER_SECRET differs
        return UpstreamFailed(f"a worker refused this gateway's worker secret: {error.message}")
    if error.kind == "unavailable":
        return Unavailable(error.message)
    return UpstreamFailed(error.message)


async def stream_events(pool: ModelPool, request: GenerateRequest) -> AsyncIterator[Event]:
    body = msgspec.json.encode(request)
    last_error: SluiceError = Unavailable(f"model {pool.name!r} has no ready worker; retry shortly")
    for replica in pool.candidates():
        relayed = False
        pending: Accepted | None = None  # held until the first token so a retry stays invisible
        replica.in_flight += 1
        try:
            async with replica.client.stream("POST", "/generate", content=body,
                                             headers={"content-type": "application/json"}) as response:
                if response.status_code != 200:
                    error = msgspec.json.decode(await response.aread(), type=Error)
                    last_error = worker_error(error)
                    if error.kind in RETRYABLE_KINDS:
                        continue
                    raise last_error
                async for line in response.aiter_lines():
                    if not line:
                        continue
                    try:
                        event = decode_event(line.encode())
                    except msgspec.DecodeError as exc:
                        # an event off the contract: the same request gets the same answer from any replica,
                        # so no retry, and this replica stays healthy (other requests are not refused)
                        raise UpstreamFailed(f"the worker sent an event the gateway cannot read ({exc})") from exc
                    if isinstance(event, Error):  # never relayed as an event: a dialect would skip it
                        last_error = worker_error(event)
                        if not relayed and event.kind in RETRYABLE_KINDS:
                            break
                        raise last_error
                    if isinstance(event, Accepted) and not relayed:
                        pending = event
                        continue
                    if pending is not None:
                        relayed = True
                        yield pending
                        pending = None
                    relayed = True
                    yield event
                else:
                    if relayed:
                        return
                    last_error = UpstreamFailed("the worker closed the stream without a result")
        except (httpx.TransportError, msgspec.DecodeError) as exc:
            if relayed:
                raise UpstreamFailed(f"the worker connection broke mid-generation ({type(exc).__name__})") from exc
            log.warning("replica_unreachable", url=replica.url, error=repr(exc))
            replica.healthy = False  # the poller brings it back once it answers again
            last_error = Unavailable(f"worker {replica.url} is unreachable")
        finally:
            replica.in_flight -= 1
    raise last_error
