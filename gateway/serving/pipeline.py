"""One generation request through the gateway, the same for every dialect:

    (authenticated by the middleware) -> read + parse (dialect) -> endpoint + permission -> admit (limits)
    -> a replica from the endpoint's activator (waiting while it wakes) -> proxy to the worker, with
    failover -> render (dialect) -> settle limits -> one ledger record (with the wait, `cold_start_ms`)

Errors at any point are rendered in the dialect's own envelope. Streamed responses account in the
generator's `finally`, so a client that disconnects is billed for what was generated until then.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from functools import partial
from typing import Any, TypeVar

import anyio
import msgspec
import structlog
from litestar import Request, Response
from litestar.response import Stream

from auth import Principal
from common.errors import LedgerUnavailable
from common.headers import header
from common.json_body import read_json
from common.protocol import Event, Finish
from gateway.authentication.headers import client_address
from gateway.edge.access_log import outcome_of, request_id_of
from gateway.endpoints.activator import Lease, StillWaiting
from gateway.endpoints.adapters import split_model
from gateway.endpoints.controller import EndpointController
from gateway.endpoints.deadline import SCALE_UP_TIMEOUT_HEADER, parse_scale_up_timeout, wait_deadline
from gateway.errors import GenerationFailed, RequestTimedOut, SluiceError
from gateway.serving.accounting import Accounting
from gateway.serving.collect import Result, merge
from gateway.serving.dialect import Dialect, Meta, Parsed
from gateway.serving.rejections import count_rejection
from gateway.serving.services import DEFAULT_MODEL, Services

_json = msgspec.json.Encoder()
FAILED_FINISHES = {
    "error": "choice {index} failed: the structured-output grammar refused the model's next token, so the output "
             "so far is not valid; retry, or loosen the schema",
    "cancelled": "choice {index} was cancelled by the worker before it finished",
}
SSE_MEDIA_TYPE = "text/event-stream"
KEEPALIVE_S = 10.0  # below the idle timeouts of common proxies (nginx 60 s, AWS ALB 60 s)
KEEPALIVE = b": waiting for a replica\n\n"  # an SSE comment: every SSE client skips it
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before the answer; nobody reads it
T = TypeVar("T")
UNREAD: Any = object()  # the body has not been read yet (a route that dispatches by body reads it first)


async def handle_generation(request: Request, services: Services, dialect: Dialect, route: str,
                            payload: Any = UNREAD) -> Response | Stream:
    principal: Principal = request.user  # set by the authentication middleware
    request_id = request_id_of(request)
    accounting = Accounting(services, principal, request_id, dialect.name, route, outcome_of(request))
    finalizers = request.scope["state"].setdefault("finalizers", [])
    finalizers.append(accounting.finalizer)
    try:
        if payload is UNREAD:
            payload = await read_json(request)
        if dialect.model_optional and isinstance(payload, dict) and payload.get("model") is None:
            # TGI and SGLang bodies name no model: the first endpoint the caller may see
            payload["model"] = services.endpoints.resolve(DEFAULT_MODEL, principal).name
        if isinstance(payload, dict) and isinstance(payload.get("model"), str):
            accounting.model = payload["model"]  # a rejected request is still attributed to its model
        parsed = dialect.parse(payload, route)
        if "mock_response" in parsed.extra:  # MonsterAPI: canned, never reaches a worker, never billed
            accounting.discard()
            return Response(_json.encode(parsed.extra["mock_response"]), media_type="application/json")
        endpoints = services.endpoints
        endpoint_name, named_adapter = split_model(parsed.model, endpoints.controllers)
        endpoint = endpoints.resolve(endpoint_name, principal)
        parsed.model = endpoint.name
        accounting.model = parsed.model
        structlog.contextvars.bind_contextvars(team_id=principal.team_id, model=parsed.model)
        services.auth.check_model(principal, parsed.model)
        if services.ledger is not None:
            services.ledger.check_writable()  # never serve what could not be billed
        adapter_name = named_adapter or parsed.adapter
        adapter = None if adapter_name is None else services.adapters.ref(
            parsed.model, adapter_name, "model" if named_adapter else parsed.adapter_field)
        accounting.adapter = adapter_name
        header_s = parse_scale_up_timeout(header(request, SCALE_UP_TIMEOUT_HEADER))
        await accounting.admit(parsed)
        tenant = tenant_of(principal.team_id)
        for index, generate in enumerate(parsed.requests):
            generate.request_id = f"{request_id}-{index}"
            generate.model = parsed.model
            generate.adapter = adapter
            generate.tenant = tenant
        deadline = wait_deadline(time.monotonic(), time.time(), max_wait_s=endpoint.spec.max_wait_seconds,
                                 header_s=header_s, request_deadline_unix=parsed.requests[0].deadline_unix)
        meta = Meta(request_id, int(time.time()), parsed.model)
        # every lease this request takes: the last finalizer hands back any that no stream took over
        # (a client gone before its stream began), or its replica would count a request forever
        held: list[Lease] = []
        finalizers.append(partial(_release_unused, services, endpoint, held))
        count = len(parsed.requests)
        while len(held) < count and (free := endpoints.take_free(endpoint, tenant)) is not None:
            held.append(free)  # the usual case: nothing to wait for, nothing to watch
        if not held and parsed.stream and dialect.stream_media_type == SSE_MEDIA_TYPE:
            waiting = endpoints.wait(endpoint, deadline, keepalive_s=KEEPALIVE_S, tenant=tenant)
            finalizers.append(waiting.aclose)  # leaves the queue if the stream below never starts
            step = await _unless_gone(request, _next_step(waiting))
            if isinstance(step, StillWaiting):  # the endpoint is waking: answer now, keep the connection open
                return Stream(_stream_after_wait(services, dialect, parsed, endpoint, waiting, deadline, meta,
                                                 accounting, held),
                              media_type=dialect.stream_media_type, headers=_stream_headers(accounting))
            held.append(step)
        leases = held if len(held) == count else await _unless_gone(request, _leases(services, endpoint, parsed,
                                                                                        deadline, held))
        accounting.cold_start_ms = max(lease.cold_start_ms for lease in leases)
        streams = _worker_streams(services, endpoint, leases, parsed, deadline)
        if parsed.stream:
            merged = _events(services, dialect, streams)
            # a client that leaves before the stream starts never runs the generator: the request's
            # finalizer (gateway/edge/access_log.py) records it then, since finish runs exactly once
            first = await _first_event(merged)  # errors before the first token keep their real status
            if first is not None:
                accounting.observe(first[1])
            return Stream(_stream(dialect, parsed, first, merged, meta, accounting),
                          media_type=dialect.stream_media_type, headers=_stream_headers(accounting))
        results = await collect_answer(dialect, streams, accounting.observe, services.settings.request_timeout_s)
        body = dialect.render(parsed, results, meta)
        await accounting.finish("ok")
        extra = dialect.response_headers(parsed, results, time.perf_counter() - accounting.started,
                                         accounting.dispatched - accounting.started)
        return Response(_json.encode(body), media_type="application/json", headers={**accounting.headers(), **extra})
    except SluiceError as raised:
        error = raised
        if not accounting.reached_worker:  # refused before admission: what the request is (gateway/serving/rejections.py)
            error = await count_rejection(services.limiter, services.settings.rejections_per_minute, principal,
                                          client_address(request, services.auth.clients), error)
        error = dialect.reported(error)  # the ledger records the status the client gets
        await accounting.finish(accounting.failure_status(error), error)
        return dialect.error_response(error, accounting.headers())
    except ClientGone:  # left while waiting for a replica: out of the queue, nothing billed
        await accounting.finish("cancelled")
        return Response(b"", status_code=CLIENT_CLOSED_REQUEST)
    except Exception:  # e.g. the client left while its body was read: still one record, limits settled
        await accounting.finish("error")
        raise


def tenant_of(team_id: str) -> str:
    """The tenant a worker shares its grammar compiles and its admission turns by: the billed team, as an
    opaque stable tag. Unkeyed, so every gateway of a fleet names a team alike; workers and their logs never
    see the team's id."""
    return "t-" + hashlib.sha256(team_id.encode()).hexdigest()[:16]


def _worker_streams(services: Services, endpoint: EndpointController, leases: list[Lease], parsed: Parsed,
                    deadline: float) -> list[AsyncIterator[Event]]:
    """One worker stream per GenerateRequest, each on its lease, with failover."""
    return [services.workers.stream(endpoint, lease, r, deadline) for lease, r in zip(leases, parsed.requests)]


def _events(services: Services, dialect: Dialect, streams: list[AsyncIterator[Event]]
            ) -> AsyncIterator[tuple[int, Event]]:
    """A stream's events, merged, failed choices failing the request (`honest`), the whole bounded by
    request_timeout_s (`within`). A collected answer reads its streams in `collect_answer` instead."""
    return within(services.settings.request_timeout_s, honest(dialect, streams))


def _merged(streams: list[AsyncIterator[Event]]) -> AsyncIterator[Event] | AsyncIterator[tuple[int, Event]]:
    """The usual single worker stream as it is (its items are events: no merging generator in between), or
    several merged into (stream index, event) pairs."""
    return streams[0] if len(streams) == 1 else merge(streams)


def refuse_failed_choice(dialect: Dialect, event: Event) -> None:
    """A choice the worker ended by failing (a grammar that refused the model's token: its output is not valid;
    or cancelled) fails the request in a dialect whose finish vocabulary has no word for it, rather than pass for
    a normal finish ("stop", "length"): the error status, or the stream's error event."""
    if isinstance(event, Finish) and event.reason in FAILED_FINISHES and not dialect.reports_failed_choices:
        raise GenerationFailed(FAILED_FINISHES[event.reason].format(index=event.index))


async def honest(dialect: Dialect, streams: list[AsyncIterator[Event]]) -> AsyncIterator[tuple[int, Event]]:
    """The streams' events as (stream index, event), a failed choice failing the request (`refuse_failed_choice`)."""
    single = len(streams) == 1
    events = _merged(streams)
    try:
        async for item in events:
            index, event = (0, item) if single else item
            refuse_failed_choice(dialect, event)
            yield index, event
    finally:  # closed now, not when the collector finds it: it holds a worker connection
        await events.aclose()


async def within(seconds: float, events: AsyncIterator[tuple[int, Event]]) -> AsyncIterator[tuple[int, Event]]:
    """The events of a stream that may run `seconds` in all (settings.request_timeout_s, from admission):
    past that the workers are let go and RequestTimedOut is raised, before the concurrency lease expires.
    One timer for the whole stream: asyncio.timeout per event cost a tenth of a streamed token's relay."""
    loop = asyncio.get_running_loop()
    expired = False
    reading: asyncio.Task | None = None  # the task waiting for the next event, cancelled when time runs out

    def expire() -> None:
        nonlocal expired
        expired = True
        if reading is not None:
            reading.cancel()

    timer = loop.call_later(seconds, expire)
    try:
        while not expired:
            reading = asyncio.current_task(loop)
            try:
                item = await anext(events)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if expired and reading.uncancel() == 0:  # ours alone; a client's disconnect stays a cancel
                    break
                raise
            finally:
                reading = None
            yield item
        raise past_limit(seconds)
    finally:
        timer.cancel()
        await events.aclose()


def past_limit(seconds: float) -> RequestTimedOut:
    return RequestTimedOut(f"the request ran past this gateway's limit of {seconds:g} s (request_timeout_s); "
                           "ask for fewer tokens or split it")


def _stream_headers(accounting: Accounting) -> dict[str, str]:
    return {**accounting.headers(), "cache-control": "no-cache", "x-accel-buffering": "no"}


async def _next_step(waiting: AsyncIterator[StillWaiting | Lease]) -> StillWaiting | Lease:
    """The first thing the activator says: a lease, or that the request still waits after KEEPALIVE_S."""
    try:
        step = await anext(waiting)
    except BaseException:
        await waiting.aclose()
        raise
    if isinstance(step, Lease):
        await waiting.aclose()
    return step


async def _leases(services: Services, endpoint: EndpointController, parsed: Parsed, deadline: float,
                  leases: list[Lease]) -> list[Lease]:
    """`leases` (those already taken) filled up to one per GenerateRequest of the client's request; none is
    kept when one cannot be had (a client that leaves while waiting cancels this: its place in the queue
    goes with it)."""
    tenant = parsed.requests[0].tenant  # the billed team's: queued leases are released in tenants' turns
    try:
        while len(leases) < len(parsed.requests):
            leases.append(await services.endpoints.acquire(endpoint, deadline, tenant))
    except BaseException:
        for lease in leases:
            services.endpoints.release(endpoint, lease)
        raise
    return leases


def _release_unused(services: Services, endpoint: EndpointController, leases: list[Lease]) -> None:
    for lease in leases:
        services.endpoints.release(endpoint, lease)  # a no-op for a lease its stream already released


class ClientGone(Exception):
    """The client disconnected while its request waited for a replica."""


async def _unless_gone(request: Request, work: Awaitable[T]) -> T:
    """`work` (a wait for a replica), cancelled when the client disconnects first: its place in the queue
    is freed at once, not when a replica would have come or the wait ran out. No response has begun, so
    nothing else is listening for the disconnect. Raises ClientGone."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        raise ClientGone
    return task.result()  # what the wait ended with, if it ended as the client left


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects (its body was read already: a disconnect is all that can come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _stream_after_wait(services: Services, dialect: Dialect, parsed: Parsed, endpoint: EndpointController,
                             waiting: AsyncIterator[StillWaiting | Lease], deadline: float, meta: Meta,
                             accounting: Accounting, held: list[Lease]) -> AsyncIterator[bytes]:
    """A stream whose endpoint is still waking after KEEPALIVE_S: an SSE comment every KEEPALIVE_S keeps
    idle-timeout proxies from closing the connection; a refusal then comes as the dialect's error event. A
    client that leaves while waiting leaves the queue and is recorded as cancelled, with nothing billed and
    its rate-limit reservation settled at zero."""
    yield KEEPALIVE
    try:
        async with aclosing(waiting):
            async for step in waiting:
                if isinstance(step, StillWaiting):
                    yield KEEPALIVE
                else:
                    held.append(step)
        leases = await _leases(services, endpoint, parsed, deadline, held)
    except SluiceError as error:
        await accounting.finish(accounting.failure_status(error), error)
        yield dialect.stream_error(error)
        return
    except BaseException:
        with anyio.CancelScope(shield=True):
            await accounting.finish("cancelled")
        raise
    accounting.cold_start_ms = max(lease.cold_start_ms for lease in leases)
    merged = _events(services, dialect, _worker_streams(services, endpoint, leases, parsed, deadline))
    async for chunk in _stream(dialect, parsed, None, merged, meta, accounting):
        yield chunk


async def collect_answer(dialect: Dialect, streams: list[AsyncIterator[Event]], observe: Callable[[Event], None],
                         seconds: float) -> list[Result]:
    """Every event of a non-streamed answer, each `observe`d (accounting) and gathered per stream, a failed choice
    failing it (`refuse_failed_choice`), within `seconds` (request_timeout_s) in all: past that RequestTimedOut,
    every stream closed. The streams are read here, not through `honest`: a generator less per event.
    The limit is one timer that cancels this task: asyncio.timeout was about 2 % of a request."""
    results = [Result() for _ in streams]
    single = len(streams) == 1
    task = asyncio.current_task()
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        async with aclosing(_merged(streams)) as events:  # closed now: it holds worker connections
            async for item in events:
                index, event = (0, item) if single else item
                refuse_failed_choice(dialect, event)
                observe(event)
                results[index].add(event)
    except asyncio.CancelledError:
        if expired and task.uncancel() == 0:  # ours alone; a client's disconnect stays a cancel
            raise past_limit(seconds) from None
        raise
    finally:
        timer.cancel()
    return results


async def _first_event(merged: AsyncIterator[tuple[int, Event]]) -> tuple[int, Event] | None:
    """Wait for the workers' first event before any header goes out, so a refusal that comes before
    the first token (deadline missed, prompt too long, worker validation) is a real 4xx, not a 200
    with an error event. The proxy holds `Accepted` back until the first token, so nothing is lost."""
    try:
        return await anext(merged)
    except StopAsyncIteration:
        return None
    except BaseException:
        await merged.aclose()
        raise


async def _stream(dialect: Dialect, parsed: Parsed, first: tuple[int, Event] | None, merged, meta: Meta,
                  accounting: Accounting) -> AsyncIterator[bytes]:
    async def observed() -> AsyncIterator[tuple[int, Event]]:
        if first is not None:  # observed when it arrived
            yield first
        async for index, event in merged:
            accounting.observe(event)
            yield index, event

    status = "cancelled"
    rendered = dialect.stream(parsed, observed(), meta)
    held: bytes | None = None  # the last chunk waits until the usage record is durable
    try:
        async for chunk in rendered:
            if held is not None:
                yield held
            held = chunk
        status = "ok"
        await accounting.finish("ok")
    except SluiceError as error:
        status = "error"
        if held is not None and not isinstance(error, LedgerUnavailable):  # unbilled: the end is withheld
            yield held
        held = None
        await accounting.finish("error", error)
        yield dialect.stream_error(error)
    finally:
        # a client disconnect cancels this task's scope: shield the cleanup, or settle and the ledger
        # record would be cancelled too (the concurrency slot would leak until its lease expires)
        with anyio.CancelScope(shield=True):
            await rendered.aclose()
            await merged.aclose()
            await accounting.finish(status)
    if held is not None:
        yield held
