"""One generation request through the gateway, the same for every dialect, in stages that `handle_generation`
runs top to bottom, each filling in its part of the request's `RequestContext` (gateway.serving.context):

    parse      the body (the dialect's) -> one internal GenerateRequest per prompt
    authorize  the endpoint it names, the key's permission for it, a ledger that can bill it, its LoRA adapter
    admit      the key's and the team's limits (a reservation); the worker-facing requests; the wait's deadline
    lease      one replica per GenerateRequest from the endpoint's activator, waiting while it wakes
    relay      worker events (with failover) -> the dialect's collected answer or stream, in request_timeout_s
    settle     limits settled, one ledger record (`RequestContext.settle`, the one door)

The caller was authenticated before (the middleware, or the fast path): `request.user`. An error at any stage
is answered in the dialect's envelope and settled. Whatever else ends a request (a client gone while it waits
or mid-stream, a cancelled task) leaves it to its request scope (gateway.serving.request_scope), which settles
it once, as cancelled, when the response is over: a client that disconnects is billed for what was generated
until then.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import anyio
import msgspec
import structlog
from litestar import Request, Response
from litestar.response import Stream

from common.errors import LedgerUnavailable
from common.headers import header
from common.json_body import read_json_then
from common.large_bodies import owner_of
from common.protocol import Event
from gateway.endpoints.activator import Lease, StillWaiting
from gateway.endpoints.adapters import split_model
from gateway.endpoints.deadline import SCALE_UP_TIMEOUT_HEADER, parse_scale_up_timeout, wait_deadline
from gateway.errors import SluiceError
from gateway.replicas.token_lines import TokenLines
from gateway.serving.answer import collect_answer, honest, within
from gateway.serving.answer_body import answer_body
from gateway.serving.client_gone import CLIENT_CLOSED_REQUEST, ClientGone, unless_gone
from gateway.serving.context import RequestContext
from gateway.serving.dialect import Dialect, Meta
from gateway.serving.model_aliases import endpoint_named
from gateway.serving.rejections import count_rejection, refused_by_worker
from gateway.serving.render_process import RENDERER
from gateway.serving.request_tags import end_user_and_tags
from gateway.serving.services import Services

_json = msgspec.json.Encoder()
SSE_MEDIA_TYPE = "text/event-stream"
KEEPALIVE_S = 10.0  # below the idle timeouts of common proxies (nginx 60 s, AWS ALB 60 s)
KEEPALIVE = b": waiting for a replica\n\n"  # an SSE comment: every SSE client skips it
CANNED = "mock_response"  # MonsterAPI: a canned answer that never reaches a worker and is never billed
UNREAD: Any = object()  # the body has not been read yet (a route that dispatches by body reads it first)


async def handle_generation(request: Request, services: Services, dialect: Dialect, route: str,
                            payload: Any = UNREAD) -> Response | Stream:
    context = RequestContext.open(request, services, dialect, route)
    try:
        await parse(context, payload)
        if CANNED in context.parsed.extra:
            context.discard()
            return Response(_json.encode(context.parsed.extra[CANNED]), media_type="application/json")
        authorize(context)
        await admit(context)
        waiting = await lease(context)
        return await relay(context, waiting)
    except ClientGone:  # left while waiting for a replica: out of the queue; its request scope settles it
        return Response(b"", status_code=CLIENT_CLOSED_REQUEST)
    except SluiceError as error:
        return await refuse(context, error)
    except Exception:  # a fault (the client's body could not be read, a bug): still one record, limits settled
        await context.settle("error")
        raise


async def parse(context: RequestContext, payload: Any) -> None:
    """The body, read unless the route read it, parsed by the dialect, with the end user and tags it names. A
    rejected request is still attributed to the model it names."""
    dialect, route = context.dialect, context.route
    parsed: Any = UNREAD
    if payload is UNREAD:  # read here: a large body is parsed where it is decoded, off the event loop
        payload, parsed = await read_json_then(context.request, lambda value: _parsed(dialect, route, value))
    if dialect.model_optional and isinstance(payload, dict) and payload.get("model") is None:
        # TGI and SGLang bodies name no model: the first endpoint the caller may see
        payload["model"] = endpoint_named(context.services.endpoints, None, context.principal).name
        parsed = UNREAD
    if isinstance(payload, dict) and isinstance(payload.get("model"), str):
        context.accounting.model = payload["model"]
    if isinstance(parsed, SluiceError):
        raise parsed
    request, (end_user, tags) = _parse_and_label(dialect, route, payload) if parsed is UNREAD else parsed
    context.parsed = request
    context.accounting.end_user, context.accounting.tags = end_user, tags


def _parse_and_label(dialect: Dialect, route: str, payload: Any) -> tuple[Any, tuple[str | None, dict[str, str]]]:
    """(the dialect's parse of the body, (its end user, its tags)); a refusal of either raised."""
    return dialect.parse(payload, route), end_user_and_tags(dialect.name, payload)


def _parsed(dialect: Dialect, route: str, payload: Any) -> tuple[Any, Any]:
    """(the body, its parse and labels or the refusal of them); UNREAD where a model is still to be chosen (on the
    loop). Once parsed, only the body's `model` goes back: the rest (a large body's 400k ids) is freed here, not
    on the loop."""
    if dialect.model_optional and isinstance(payload, dict) and payload.get("model") is None:
        return payload, UNREAD
    try:
        parsed: Any = _parse_and_label(dialect, route, payload)
    except SluiceError as error:  # raised by `parse`, once the model it names is on the record
        parsed = error.with_traceback(None)  # its frames would keep the body alive
    return ({"model": payload.get("model")} if isinstance(payload, dict) else None), parsed


def authorize(context: RequestContext) -> None:
    """The endpoint the body names (404: none the caller may see), the key's permission for it (403), a ledger
    that can take the record (503: never serve what could not be billed), the LoRA adapter it names (404)."""
    services, parsed, principal = context.services, context.parsed, context.principal
    endpoint_name, named_adapter = split_model(parsed.model, services.endpoints.controllers)
    context.endpoint = endpoint_named(services.endpoints, endpoint_name, principal)
    parsed.model = context.accounting.model = context.endpoint.name
    structlog.contextvars.bind_contextvars(team_id=principal.team_id, model=parsed.model)
    services.auth.check_model(principal, parsed.model)
    if services.ledger is not None:
        services.ledger.check_writable()
    adapter_name = named_adapter or parsed.adapter
    if adapter_name is not None:
        context.adapter = services.adapters.ref(parsed.model, adapter_name,
                                                "model" if named_adapter else parsed.adapter_field)
    context.accounting.adapter = adapter_name


async def admit(context: RequestContext) -> None:
    """Reserve against the key's and the team's limits (429 over them), then name the requests the workers get,
    and set when a wait for a replica gives up: the earliest of the endpoint's max_wait_seconds, the caller's
    X-Scale-Up-Timeout and the request's own deadline."""
    parsed = context.parsed
    header_s = parse_scale_up_timeout(header(context.request, SCALE_UP_TIMEOUT_HEADER))
    await context.accounting.admit(parsed)
    context.tenant = tenant_of(context.principal.team_id)
    for index, generate in enumerate(parsed.requests):
        generate.request_id = f"{context.request_id}-{index}"
        generate.model = parsed.model
        generate.adapter = context.adapter
        generate.tenant = context.tenant
    context.deadline = wait_deadline(time.monotonic(), time.time(), max_wait_s=context.endpoint.spec.max_wait_seconds,
                                     header_s=header_s, request_deadline_unix=parsed.requests[0].deadline_unix)
    context.meta = Meta(context.request_id, int(time.time()), parsed.model)


def tenant_of(team_id: str) -> str:
    """The tenant a worker shares its grammar compiles and its admission turns by: the billed team, as an
    opaque stable tag. Unkeyed, so every gateway of a fleet names a team alike; workers and their logs never
    see the team's id."""
    return "t-" + hashlib.sha256(team_id.encode()).hexdigest()[:16]


async def lease(context: RequestContext) -> AsyncIterator[StillWaiting] | None:
    """One lease per GenerateRequest, in `context.leases`: free replicas at once in the usual case, else a wait
    in the endpoint's queue, given up when the client leaves (ClientGone). None once every lease is held; for an
    SSE stream whose endpoint is still waking after KEEPALIVE_S, the rest of the wait (a StillWaiting every
    KEEPALIVE_S), which the response goes on with while it sends keep-alives. No lease is kept when one cannot
    be had (the queue is full, the wait ran out, the client left)."""
    activator, wanted = context.endpoint.activator, len(context.parsed.requests)
    try:
        while len(context.leases) < wanted and (free := activator.take_free(tenant=context.tenant)) is not None:
            context.leases.append(free)  # the usual case: nothing to wait for, nothing to watch
        if len(context.leases) == wanted:
            return None
        keeps_alive = context.parsed.stream and context.dialect.stream_media_type == SSE_MEDIA_TYPE
        waiting = _wait_for_leases(context, KEEPALIVE_S if keeps_alive else math.inf)
        return waiting if await unless_gone(context.request, _still_waiting(waiting)) else None
    except BaseException:
        context.release_leases()
        raise


async def _wait_for_leases(context: RequestContext, keepalive_s: float) -> AsyncIterator[StillWaiting]:
    """The leases still missing, from the endpoint's queue (released in tenants' turns), a StillWaiting every
    `keepalive_s` while queued. Closing it leaves the queue; a failed wait hands back the leases it had."""
    activator = context.endpoint.activator
    try:
        while len(context.leases) < len(context.parsed.requests):
            async with aclosing(activator.wait(context.deadline, keepalive_s, tenant=context.tenant)) as steps:
                async for step in steps:
                    if isinstance(step, Lease):
                        context.leases.append(step)
                    else:
                        yield step
    except BaseException:
        context.release_leases()
        raise


async def _still_waiting(waiting: AsyncIterator[StillWaiting]) -> bool:
    """Whether the wait says it still waits before it has every lease."""
    try:
        await anext(waiting)
    except StopAsyncIteration:
        return False
    return True


def worker_streams(context: RequestContext, raw_tokens: bool = False) -> list[AsyncIterator[Event | TokenLines]]:
    """One worker stream per GenerateRequest, each on its lease, with failover (each stream owns its lease from
    here on). The request's cold start is its longest wait for a replica. `raw_tokens`: token events undecoded
    (a collected answer's: gateway/replicas/token_lines.py)."""
    context.accounting.cold_start_ms = max(lease.cold_start_ms for lease in context.leases)
    workers = context.services.workers
    return [workers.stream(context.endpoint, lease, generate, context.deadline, raw_tokens)
            for lease, generate in zip(context.leases, context.parsed.requests)]


async def relay(context: RequestContext, waiting: AsyncIterator[StillWaiting] | None) -> Response | Stream:
    """The workers' answer in the dialect's framing: a stream, or a collected answer settled before it is sent."""
    dialect, parsed, accounting = context.dialect, context.parsed, context.accounting
    if waiting is not None:  # the endpoint is waking: answer now, keep the connection open
        context.reading = waiting
        return Stream(_stream_after_wait(context, waiting), media_type=dialect.stream_media_type,
                      headers=_stream_headers(context))
    if parsed.stream:
        events = _events(context, worker_streams(context))
        first = await _first_event(events)  # errors before the first token keep their real status
        context.reading = events  # until the response reads it to the end
        if first is not None:
            accounting.observe(first[1])
        return Stream(_stream(context, first, events), media_type=dialect.stream_media_type,
                      headers=_stream_headers(context))
    owner = owner_of(context.request.scope)
    RENDERER.check(owner)  # 429 while the team's large answers wait to be rendered: before a worker is asked
    results = await collect_answer(dialect, worker_streams(context, raw_tokens=True), accounting.observe,
                                   context.relay_timeout_s)
    body = await answer_body(dialect, parsed, results, context.meta, owner)  # a large one off the event loop
    await context.settle("ok")
    extra = dialect.response_headers(parsed, results, time.perf_counter() - accounting.started,
                                     accounting.dispatched - accounting.started)
    return Response(body, media_type="application/json", headers={**accounting.headers(), **extra})


async def refuse(context: RequestContext, error: SluiceError) -> Response:
    """The error in the dialect's envelope, settled with the status the client gets. A request refused before
    admission, or by a worker for what it is, counts against the rejection budget (gateway/serving/rejections.py)."""
    services, accounting = context.services, context.accounting
    if not accounting.reached_worker or refused_by_worker(error):
        error = await count_rejection(services, context.request, error)
    error = context.dialect.reported(error)
    await context.settle(accounting.failure_status(error), error)
    return context.dialect.error_response(error, accounting.headers())


def _events(context: RequestContext, streams: list[AsyncIterator[Event]]) -> AsyncIterator[tuple[int, Event]]:
    """A stream's events, merged, failed choices failing the request (`honest`), the whole bounded by
    request_timeout_s (`within`). A collected answer reads its streams in `collect_answer` instead."""
    return within(context.relay_timeout_s, honest(context.dialect, streams))


def _stream_headers(context: RequestContext) -> dict[str, str]:
    return {**context.accounting.headers(), "cache-control": "no-cache", "x-accel-buffering": "no"}


async def _first_event(events: AsyncIterator[tuple[int, Event]]) -> tuple[int, Event] | None:
    """Wait for the workers' first event before any header goes out, so a refusal that comes before
    the first token (deadline missed, prompt too long, worker validation) is a real 4xx, not a 200
    with an error event. The proxy holds `Accepted` back until the first token, so nothing is lost."""
    try:
        return await anext(events)
    except StopAsyncIteration:
        return None
    except BaseException:
        await events.aclose()
        raise


async def _stream_after_wait(context: RequestContext, waiting: AsyncIterator[StillWaiting]) -> AsyncIterator[bytes]:
    """A stream whose endpoint is still waking after KEEPALIVE_S: an SSE comment every KEEPALIVE_S keeps
    idle-timeout proxies from closing the connection; a refusal then comes as the dialect's error event. A
    client that leaves while waiting leaves the queue; its request scope records it as cancelled, with nothing
    billed and its rate-limit reservation settled at zero."""
    try:
        async with aclosing(waiting):
            yield KEEPALIVE
            async for _ in waiting:
                yield KEEPALIVE
    except SluiceError as error:
        with anyio.CancelScope(shield=True):
            await context.settle(context.accounting.failure_status(error), error)
        yield context.dialect.stream_error(error)
        return
    events = context.reading = _events(context, worker_streams(context))
    async for chunk in _stream(context, None, events):
        yield chunk


async def _stream(context: RequestContext, first: tuple[int, Event] | None,
                  events: AsyncIterator[tuple[int, Event]]) -> AsyncIterator[bytes]:
    """The stream's chunks in the dialect's framing. The last is held back until the request is settled (never
    served unbilled); an error is the dialect's error event. The workers' streams are closed the moment the
    answer ends, and the request is settled then: both shielded, for a client that leaves cancels this task's
    scope and must cut neither short. A stream cut short (the client left) is settled by its request scope."""
    dialect, accounting = context.dialect, context.accounting
    seen = first is not None

    async def observed() -> AsyncIterator[tuple[int, Event]]:
        nonlocal seen
        if first is not None:  # observed when it arrived
            yield first
        async for index, event in events:
            seen = True
            accounting.observe(event)
            yield index, event

    rendered = dialect.stream(context.parsed, observed(), context.meta)
    held: bytes | None = None
    answered = False
    try:
        try:
            async for chunk in rendered:
                if held is not None:
                    yield held
                held = chunk
            answered = True
        finally:
            with anyio.CancelScope(shield=True):  # one shield for the close and, once answered, the settlement
                await rendered.aclose()
                await events.aclose()
                context.reading = None
                if answered:
                    await context.settle("ok")  # LedgerUnavailable: the error event below, the end withheld
    except SluiceError as error:
        with anyio.CancelScope(shield=True):
            if not seen and refused_by_worker(error):
                # the worker refused what the request is after its wait in the queue (200 already sent): this costs
                # the rejection budget as a refusal before any header does
                error = await count_rejection(context.services, context.request, error)
            await context.settle("error", error)
        if held is not None and not isinstance(error, LedgerUnavailable):
            yield held
        held = None
        yield dialect.stream_error(error)
    if held is not None:
        yield held
