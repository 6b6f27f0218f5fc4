"""The generation routes, answered without Litestar's per-request machinery.

Why: under load, Litestar's layers around our handler (the router, the exception middleware, the
authentication middleware, the signature model and dependency injection, the response handler lookup) cost
the event loop more than the generation's own work. The routes marked `opt=DIRECT` all have one shape:
parameters among `request`, `services`, `payload` (the JSON body), an API key, errors in the route's dialect.
The app answers an exact (method, path) match of one of them here, with the same parts Litestar would run: the
same ASGI middlewares (request id, write timeout), the same authentication
(`gateway.authentication.middleware.principal`), the route's own exception handler and response handling. What
is skipped is the generic work of finding and assembling those parts on every request, and, for a plain
`Response` of bytes (`_plain`), Litestar's response objects: the same ASGI messages are built directly (a body over
BODY_PIECE in several writes, `send_body`).

Everything else (another path or method, a path that only matches after normalisation, websockets) goes
through Litestar, and these routes stay registered there: the OpenAPI document, HEAD, OPTIONS and
405 answers are unchanged.

What the path cannot run it refuses when the app is built (`DirectRouteError`), so a setting added later never
silently skips the generation routes: anything wrapped around Litestar's router (CORS, OpenTelemetry), CSRF,
compression, allowed hosts, exception hooks, middleware other than the list given here plus authentication, and
on a route guards, before-request and after-response hooks, caching or its own request class. The Litestar
attributes this module reads are pinned by a minor version in pyproject.toml and by
tests/gateway/test_fast_path_litestar.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from functools import reduce
from typing import Any

from litestar import Litestar, MediaType, Request, Response
from litestar.handlers import HTTPRouteHandler
from litestar.middleware import DefineMiddleware
from litestar.status_codes import HTTP_204_NO_CONTENT, HTTP_304_NOT_MODIFIED
from litestar.types import ASGIApp, Receive, Scope, Send
from litestar.utils.helpers import get_enum_string_value

from common.json_body import read_json
from gateway.authentication.middleware import ApiKeyAuthentication, principal

DIRECT = {"direct": True}  # `opt` of a generation route answered here
BODY_PIECE = 256 << 10  # the most of a body one write hands the socket: about 0.1 ms of copying
PARAMETERS = {"request", "services", "payload"}

Middleware = Callable[[ASGIApp], ASGIApp]
# the app settings that add work around every route, which the direct routes would skip
_APP_SETTINGS = ("csrf_config", "compression_config", "allowed_hosts", "after_exception")
# a route's settings that Litestar's route runs around the handler: (resolver, what it is)
_ROUTE_SETTINGS = (("resolve_guards", "guards"), ("resolve_before_request", "a before_request hook"),
                   ("resolve_after_response", "an after_response hook"))


class DirectRouteError(TypeError):
    """The app or a DIRECT route asks for something the direct path would skip."""


def serve_directly(app: Litestar, middleware: Sequence[Middleware]) -> None:
    """Answer the app's DIRECT routes ahead of its router, through `middleware` (outermost first: the app's own
    list minus authentication, which the route does itself). DirectRouteError names what it cannot honour."""
    routes: dict[tuple[str, str], ASGIApp] = {}
    for route in app.routes:
        for method, (handler, _) in getattr(route, "route_handler_map", {}).items():
            if handler.opt.get("direct"):
                check_honoured(app, handler, middleware)
                routes[(method, route.path)] = reduce(lambda inner, wrap: wrap(inner), reversed(middleware),
                                                      _answer(app, handler))
    litestar = app.asgi_handler

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        direct = routes.get((scope.get("method", ""), scope["path"])) if scope["type"] == "http" else None
        await (litestar if direct is None else direct)(scope, receive, send)

    app.asgi_handler = dispatch


def check_honoured(app: Litestar, handler: HTTPRouteHandler, middleware: Sequence[Middleware]) -> None:
    """Refuse every setting of the app or of `handler` that Litestar would run for the route and the direct path
    would not (see the module docstring)."""
    name = handler.fn.__name__
    parameters = set(handler.parsed_fn_signature.parameters)
    if not parameters <= PARAMETERS:  # a route that needs Litestar's injection is not one for this path
        raise DirectRouteError(f"{name} is marked DIRECT but takes {sorted(parameters - PARAMETERS)}")
    # Litestar wraps its router in its exception handler, then in CORS and OpenTelemetry when configured
    if getattr(app.asgi_handler, "app", None) is not app.asgi_router:
        raise DirectRouteError(f"the app wraps its router ({type(app.asgi_handler).__name__}, e.g. cors_config or "
                               f"tracing), which the DIRECT route {name} would skip")
    for setting in _APP_SETTINGS:
        if getattr(app, setting):
            raise DirectRouteError(f"the app sets {setting}, which the DIRECT route {name} would skip")
    for resolve, what in _ROUTE_SETTINGS:
        if getattr(handler, resolve)():
            raise DirectRouteError(f"{name} is marked DIRECT but has {what}, which the direct path would skip")
    if Exception not in handler.resolve_exception_handlers():
        raise DirectRouteError(f"{name} is marked DIRECT but no layer renders every Exception in its envelope")
    if handler.cache or handler.resolve_request_class() is not Request:
        raise DirectRouteError(f"{name} is marked DIRECT but caches or has its own request class")
    declared = list(reversed(handler.resolve_middleware()))  # outermost first, as the app lists them
    if declared[:len(middleware)] != list(middleware) or not (
            len(declared) == len(middleware) + 1 and _authenticates(declared[-1])):
        raise DirectRouteError(f"the middleware of {name} is not the fast path's list plus authentication: "
                               "pass every middleware the app adds to serve_directly")


def _authenticates(middleware: Any) -> bool:
    return isinstance(middleware, DefineMiddleware) and middleware.middleware is ApiKeyAuthentication


def _answer(app: Litestar, handler: HTTPRouteHandler) -> ASGIApp:
    parameters = set(handler.parsed_fn_signature.parameters)
    render = handler.resolve_exception_handlers()[Exception]  # every dialect router renders every exception
    call = handler.fn
    wants_payload = "payload" in parameters
    sends_plain = layers_add_nothing(handler)

    async def answer(scope: Scope, receive: Receive, send: Send) -> None:
        scope["route_handler"] = handler
        scope["path_params"] = {}
        request: Request[Any, Any, Any] = Request(scope, receive, send)
        try:
            caller = await principal(request)
            scope["user"], scope["auth"] = caller, caller.key_id
            arguments: dict[str, Any] = {"request": request, "services": app.state.services}
            if wants_payload:
                arguments["payload"] = await read_json(request)
            response = await call(**arguments)
        except Exception as exc:  # noqa: BLE001 - rendered in the route's envelope, as Litestar's handler would
            response = render(request, exc)
        plain = _plain(response, handler) if sends_plain else None
        if plain is None:
            await (await handler.to_response(app=app, data=response, request=request))(scope, receive, send)
        else:
            status, headers, body = plain
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send_body(send, body)

    return answer


async def send_body(send: Send, body: bytes) -> None:
    """`body` in writes of BODY_PIECE bytes at most (views of it, not copies), the loop taking a turn between them:
    a collected answer of 12 MiB in one write copied megabytes into the socket at once, on the loop every team's
    streams share (the socket takes what its buffer holds, uvicorn keeps the rest for later writes)."""
    if len(body) <= BODY_PIECE:
        await send({"type": "http.response.body", "body": body, "more_body": False})
        return
    view = memoryview(body)
    for start in range(0, len(body), BODY_PIECE):
        end = start + BODY_PIECE
        await send({"type": "http.response.body", "body": view[start:end], "more_body": end < len(body)})
        await asyncio.sleep(0)  # a write the socket took whole does not suspend


def layers_add_nothing(handler: HTTPRouteHandler) -> bool:
    """Whether the route's layers leave its responses as they are (no headers, cookies, hooks, background task or
    DTO of their own): then `_plain` may send them."""
    return not (handler.resolve_response_headers() or handler.resolve_response_cookies() or handler.background
                or handler.resolve_return_dto() or any(layer.after_request for layer in handler.ownership_layers))


def _plain(response: Any, handler: HTTPRouteHandler) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
    """The status, headers and body Litestar would send for a `Response` of bytes with no cookies or background
    task (every collected answer and error of a generation route), built directly, without Litestar's response
    handler and ASGIResponse objects on the hot path. None for anything else, which Litestar sends."""
    if type(response) is not Response or response.cookies or response.background is not None:
        return None
    body, status = response.content, response.status_code or handler.status_code
    if not isinstance(body, bytes) or status < 200 or status in (HTTP_204_NO_CONTENT, HTTP_304_NOT_MODIFIED):
        return None
    headers = [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in response.headers.items()]
    named = {name for name, _ in headers}
    if b"content-type" not in named:
        media_type = get_enum_string_value(response.media_type or handler.media_type or MediaType.JSON)
        if media_type.startswith("text/"):
            media_type = f"{media_type}; charset={response.encoding}"
        headers.append((b"content-type", media_type.encode("latin-1")))
    if b"content-length" not in named:
        headers.append((b"content-length", str(len(body)).encode("latin-1")))
    return status, headers, body
