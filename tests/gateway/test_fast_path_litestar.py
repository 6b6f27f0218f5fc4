"""The direct path for generation routes (gateway/dialects/fast_path.py) against Litestar itself: every app or route
setting it would skip is refused when the app is built, and the Litestar internals it reads keep their shape (a
Litestar upgrade that moves them fails here, not in production)."""

from __future__ import annotations

import inspect

import pytest
from litestar import Litestar, Request, Response, post
from litestar.config.compression import CompressionConfig
from litestar.config.cors import CORSConfig
from litestar.config.csrf import CSRFConfig
from litestar.handlers import HTTPRouteHandler
from litestar.routes import HTTPRoute
from litestar.testing import TestClient

from gateway.authentication.middleware import authentication
from gateway.config import Settings
from gateway.dialects.fast_path import DIRECT, DirectRouteError, serve_directly
from gateway.edge.app import create_app


async def _hook(*_):
    return None


def _guard(*_):
    return None


class OwnRequest(Request):
    pass


def _marking(app):
    """A middleware that marks its answers, to see that the direct path ran it."""
    async def marked(scope, receive, send):
        async def marking_send(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message["headers"], (b"x-marked", b"1")]}
            await send(message)
        await app(scope, receive, marking_send)
    return marked


RENDER = {Exception: lambda request, exc: Response(b"{}", status_code=418)}


def _direct_app(route: dict | None = None, middleware: list | None = None, **app_settings) -> Litestar:
    @post("/direct", opt=DIRECT, **(route or {}))
    async def direct(request: Request) -> Response:
        return Response(b'{"ok":true}', media_type="application/json")

    return Litestar([direct], middleware=[*(middleware or []), authentication()],
                    **{"exception_handlers": RENDER, **app_settings})


@pytest.mark.parametrize(("app_settings", "named"), [
    ({"cors_config": CORSConfig()}, "wraps its router"),
    ({"csrf_config": CSRFConfig(secret="s" * 32)}, "csrf_config"),
    ({"compression_config": CompressionConfig(backend="gzip")}, "compression_config"),
    ({"allowed_hosts": ["example.com"]}, "allowed_hosts"),
    ({"after_exception": [_hook]}, "after_exception"),
    ({"middleware": [_marking]}, "middleware"),
    ({"route": {"guards": [_guard]}}, "guards"),
    ({"route": {"before_request": _hook}}, "before_request"),
    ({"route": {"after_response": _hook}}, "after_response"),
    ({"route": {"cache": True}}, "caches"),
    ({"route": {"request_class": OwnRequest}}, "request class"),
    ({"exception_handlers": {}}, "renders every Exception"),
], ids=["cors", "csrf", "compression", "allowed-hosts", "after-exception", "extra-middleware", "guards",
        "before-request", "after-response", "cache", "request-class", "exception-handlers"])
def test_a_setting_the_direct_path_would_skip_is_refused_when_the_app_is_built(app_settings, named):
    with pytest.raises(DirectRouteError, match=named):
        serve_directly(_direct_app(**app_settings), [])


def test_the_middleware_it_is_given_runs_on_a_direct_route():
    app = _direct_app(middleware=[_marking])
    serve_directly(app, [_marking])
    with TestClient(app) as client:
        answer = client.post("/direct", headers={"Authorization": "Bearer sk-none"})
    # the route authenticated itself (no key store here: an error, rendered by the app's handler), inside the
    # middleware it was given
    assert (answer.status_code, answer.headers.get("x-marked")) == (418, "1")


def test_the_gateway_app_passes_its_own_check():
    assert create_app(Settings(), supervise=False).asgi_handler.__name__ == "dispatch"


def test_the_litestar_internals_the_direct_path_reads_keep_their_shape():
    """Each attribute gateway/dialects/fast_path.py uses; pyproject.toml pins Litestar's minor version, and a new one
    must pass this before the pin moves."""
    app = create_app(Settings(), supervise=False)
    assert isinstance(app.asgi_router, object) and hasattr(app, "asgi_handler")
    plain = Litestar([])
    assert plain.asgi_handler.app is plain.asgi_router  # the exception handler right around the router
    for setting in ("csrf_config", "compression_config", "allowed_hosts", "after_exception", "state", "routes"):
        assert hasattr(plain, setting), setting
    route = next(route for route in app.routes if isinstance(route, HTTPRoute) and route.path == "/v1/chat/completions")
    handler, _kwargs_model = route.route_handler_map["POST"]
    assert isinstance(handler, HTTPRouteHandler) and handler.opt.get("direct")
    assert set(handler.parsed_fn_signature.parameters) <= {"request", "services", "payload"}
    assert callable(handler.fn) and Exception in handler.resolve_exception_handlers()
    for resolver in ("resolve_response_headers", "resolve_response_cookies", "resolve_return_dto", "resolve_guards",
                     "resolve_before_request", "resolve_after_response", "resolve_middleware",
                     "resolve_request_class"):
        getattr(handler, resolver)()
    assert handler.background is None and handler.cache is False
    assert all(hasattr(layer, "after_request") for layer in handler.ownership_layers)
    assert list(inspect.signature(handler.to_response).parameters) == ["app", "data", "request"]
    assert list(inspect.signature(Request).parameters)[:3] == ["scope", "receive", "send"]

    # Litestar.__call__ hands every request to `asgi_handler`, which the direct path replaces
    async def answer(scope, receive, send):
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"replaced", "more_body": False})

    plain.asgi_handler = answer
    with TestClient(plain) as client:
        reply = client.get("/anything")
    assert (reply.status_code, reply.content) == (299, b"replaced")
