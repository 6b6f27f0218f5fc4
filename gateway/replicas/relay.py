"""One try of a worker call on one replica: a GenerateRequest whose events are relayed (`attempt`), or a call
with one answer, such as a tokenizer's (`exchange`).

An `attempt` is one try on one replica. Its failures before the first event reached the caller are
`RetryElsewhere` (the worker is unreachable, answered a 5xx, is overloaded, or closed without a
result): nothing was relayed, so another replica can take the request invisibly. Once an event was
relayed the client has seen output, and a broken connection is `WorkerLost` instead. A worker's `Error`
event is raised as the gateway's error, before the first token (a real status) or mid-stream (the
dialect's stream error), never passed on as an event. A fault of ours (an unreachable worker, a broken
connection, an unreadable event, a refused worker secret) is told to the client in fixed words; its detail
(addresses, exception text) goes to the log only. Events that arrive in a burst (a worker's buffered answer
of thousands) are read YIELD_EVERY at a time, the event loop serving the other requests in between. A collected
answer's token lines are passed on undecoded and uncut (`raw_tokens`: gateway/replicas/token_lines.py), all that
arrived read as one block, the loop taking a turn between blocks.

An `exchange` fails the same way before its answer: unreachable, a 5xx or a retryable worker `Error` is
`RetryElsewhere`; any other worker `Error` is the gateway's error. Moving a call to another replica is
gateway/replicas/failover.py's, over activator leases (gateway/serving/worker_client.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import structlog

from common.protocol import ERROR_STATUS, Accepted, Error, Event, decode_event
from gateway.errors import (
    AdapterUnavailable,
    ContextTooLong,
    DeadlineExceeded,
    NotFound,
    Overloaded,
    SluiceError,
    Unavailable,
    UpstreamFailed,
    ValidationFailed,
    WorkerLost,
)
from gateway.replicas.pool import Replica
from gateway.replicas.token_lines import TokenLines, token_runs
from gateway.replicas.transport import WorkerConnectionError, WorkerResponse

log = structlog.get_logger("gateway")
# what a client is told of a worker fault: no worker address, no exception text (the log line has them)
UNREACHABLE = "a worker of this model is unreachable; retry shortly"
RETRYABLE_KINDS = {"overloaded", "unavailable", "internal", "unauthorized"}  # not "timeout": the deadline passed
YIELD_EVERY = 256  # events decoded before the loop takes a turn when they come faster than it would anyway


def retried_elsewhere(error: Error) -> bool:
    """Whether another replica may answer better. Not an adapter that failed to load: its source fails the
    same everywhere, the replica's other requests are fine, and ejecting it would stall every other team."""
    return error.kind in RETRYABLE_KINDS and error.field != "adapter"


# a worker's error kind -> the gateway's error, through the status the worker answers it with (ERROR_STATUS);
# a status not here ("internal", "unauthorized") is the worker's fault: UpstreamFailed
_BY_STATUS = {kind.status: kind for kind in (ValidationFailed, NotFound, Overloaded, DeadlineExceeded, Unavailable)}


def worker_error(error: Error) -> SluiceError:
    """Map a worker `Error` event to the gateway's error hierarchy."""
    if error.field == "adapter":  # its message names the adapter's source: logged, never answered
        log.warning("adapter_unavailable", kind=error.kind, reason=error.message, retry_after_s=error.retry_after_s)
        return AdapterUnavailable("the requested adapter cannot be loaded now; retry later",
                                  retry_after_s=error.retry_after_s)
    if error.kind == "too_long":
        return ContextTooLong(error.message, param=error.field, max_context=error.max_context,
                              prompt_tokens=error.prompt_tokens, max_tokens=error.max_tokens)
    if error.kind == "unauthorized":  # our configuration, not the client's key: SLUICE_WORKER_SECRET differs
        log.error("worker_secret_refused", reason=error.message)
        return UpstreamFailed("a worker refused this gateway's worker secret (the operator's configuration)")
    kind = _BY_STATUS.get(ERROR_STATUS.get(error.kind, 500), UpstreamFailed)
    return kind(error.message, param=error.field) if kind is ValidationFailed else kind(error.message)


class RetryElsewhere(Exception):
    """The attempt failed before anything was relayed; `replica_fault`: eject the replica for a while."""

    def __init__(self, error: SluiceError, replica_fault: bool):
        super().__init__(error.message)
        self.error = error
        self.replica_fault = replica_fault


async def attempt(replica: Replica, body: bytes, raw_tokens: bool = False) -> AsyncIterator[Event | TokenLines]:
    """One try of an encoded GenerateRequest on one replica (the caller counts it in `in_flight`); `raw_tokens`:
    token events come as TokenLines, undecoded (a collected answer's)."""
    relayed = False
    pending: Accepted | None = None  # held until the first token so a retry stays invisible
    decoded = 0
    try:
        async with replica.worker.post("/generate", body) as response:
            if response.status_code != 200:
                raise _refusal(response.status_code, await response.aread())
            while (lines := await (_token_runs(response) if raw_tokens else response.next_lines())) is not None:
                for line in lines:
                    if isinstance(line, TokenLines):
                        relayed = True
                        if pending is not None:
                            yield pending
                            pending = None
                        yield line
                        continue
                    if not line.strip():
                        continue
                    decoded += 1
                    if decoded % YIELD_EVERY == 0:  # a read of buffered data does not suspend: take a turn
                        await asyncio.sleep(0)
                    try:
                        event = decode_event(line)
                    except msgspec.DecodeError as exc:
                        # an event off the contract: the same request gets the same answer from any replica,
                        # so no retry, and this replica stays healthy (other requests are not refused)
                        log.warning("worker_event_unreadable", url=replica.url, error=str(exc))
                        raise UpstreamFailed("the worker sent an event the gateway cannot read") from exc
                    if isinstance(event, Error):  # never relayed as an event: a dialect would skip it
                        if not relayed and retried_elsewhere(event):
                            raise RetryElsewhere(worker_error(event), replica_fault=event.kind != "overloaded")
                        # before the first token its real status; after, the stream's error
                        raise worker_error(event)
                    if isinstance(event, Accepted) and not relayed:
                        pending = event
                        continue
                    if pending is not None:
                        relayed = True
                        yield pending
                        pending = None
                    relayed = True
                    yield event
    except WorkerConnectionError as exc:
        if relayed:
            log.warning("worker_lost", url=replica.url, error=str(exc))
            raise WorkerLost("the worker connection broke mid-generation") from exc
        log.warning("replica_unreachable", url=replica.url, error=repr(exc))
        raise RetryElsewhere(Unavailable(UNREACHABLE), replica_fault=True) from exc
    if not relayed:
        raise RetryElsewhere(UpstreamFailed("the worker closed the stream without a result"), replica_fault=True)


async def _token_runs(response: WorkerResponse) -> list[bytes | TokenLines] | None:
    """What arrived of a collected answer, its token lines uncut (token_lines.py). `next_block` takes all that was
    buffered, so the next call waits for the socket: the loop takes a turn between any two blocks (a worker's
    burst of megabytes, read a piece at a time, held it for milliseconds)."""
    block = await response.next_block()
    return None if block is None else token_runs(block)


async def exchange(replica: Replica, path: str, body: bytes) -> AsyncIterator[bytes]:
    """One try of a call with one answer (`POST path` with a JSON body) on one replica: yields the 200 answer's
    body once. An iterator like `attempt`'s, so failover moves both kinds of call by the same rules."""
    try:
        async with replica.worker.post(path, body) as response:
            answer = await response.aread()
    except WorkerConnectionError as exc:
        log.warning("replica_unreachable", url=replica.url, error=repr(exc))
        raise RetryElsewhere(Unavailable(UNREACHABLE), replica_fault=True) from exc
    if response.status_code != 200:
        raise _refusal(response.status_code, answer)
    yield answer


def _refusal(status: int, body: bytes) -> SluiceError | RetryElsewhere:
    """A non-200 answer: the worker's own Error (retried when its kind allows), or a bare 5xx from
    whatever stands in front of it."""
    try:
        error = msgspec.json.decode(body, type=Error)
    except msgspec.DecodeError:
        if status >= 500:
            return RetryElsewhere(Unavailable(f"the worker answered {status}"), replica_fault=True)
        return UpstreamFailed(f"the worker answered {status}")
    if retried_elsewhere(error):
        return RetryElsewhere(worker_error(error), replica_fault=error.kind != "overloaded")
    return worker_error(error)
