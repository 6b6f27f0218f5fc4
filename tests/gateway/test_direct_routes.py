"""The generation routes are answered ahead of Litestar's router (gateway/dialects/fast_path.py): every one of them and
nothing else, through the same middlewares, with one log line per request. Their answers themselves (statuses,
envelopes, request ids, bodies, streams) are what every other gateway test checks, all through this path."""

from __future__ import annotations

import pytest
import structlog
from litestar import Litestar, MediaType, Request, Response, post
from litestar.background_tasks import BackgroundTask
from litestar.datastructures import Cookie
from litestar.response import Stream
from structlog.testing import capture_logs

from gateway.config import Settings
from gateway.dialects.fast_path import DIRECT, _plain, layers_add_nothing, serve_directly
from gateway.edge.app import create_app
from tests.gateway.generation_bodies import BODIES, body
from tests.gateway.route_table import route_table

GENERATION = {("POST", path) for path in BODIES} | {
    ("PUT", "/generate"), ("POST", "/"), ("POST", "/v1/completions/generate_stream"),
    ("POST", "/dedicated/v1/completions"), ("POST", "/dedicated/v1/chat/completions"), ("POST", "/v1/messages")}


def test_every_generation_route_and_nothing_else_is_answered_directly():
    app = create_app(Settings(), supervise=False)
    direct = {(method, path) for method, path, handler in route_table(app)
              if handler is not None and handler.opt.get("direct")}
    assert direct == GENERATION


def test_a_route_that_needs_more_than_the_request_services_and_body_cannot_be_direct():
    @post("/odd", opt=DIRECT)
    async def odd(request: Request, page: int) -> None:
        return None

    with pytest.raises(TypeError, match="page"):
        serve_directly(Litestar([odd]), [])


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/generate"])
async def test_a_generation_request_is_one_log_line_with_its_outcome_and_http_status(gateway_app, path):
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        response = await gateway_app.post(path, json=body(path), headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text
    lines = [line for line in logs if line["event"] in ("request_done", "http_request")]
    assert len(lines) == 1 and lines[0]["event"] == "request_done", lines
    line = lines[0]
    assert (line["http_status"], line["status"], line["method"], line["path"]) == (200, "ok", "POST", path)
    assert line["request_id"] == response.headers["x-request-id"] and line["completion_tokens"] > 0


async def test_a_refused_generation_logs_its_error_and_status(gateway_app):
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        response = await gateway_app.post("/v1/chat/completions", json=body("/v1/chat/completions", temperature=9),
                                      headers=gateway_app.key_headers)
    assert response.status_code == 400, response.text  # OpenAI's status for an invalid request
    done = [line for line in logs if line["event"] == "request_done"]
    assert len(done) == 1 and (done[0]["http_status"], done[0]["status"]) == (400, "rejected"), done
    assert done[0]["error"]


async def test_any_other_request_keeps_the_access_line(gateway_app):
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        response = await gateway_app.get("/v1/models", headers=gateway_app.key_headers)
    assert response.status_code == 200
    lines = [line for line in logs if line["event"] in ("request_done", "http_request")]
    assert [(line["event"], line["status"], line["path"]) for line in lines] == [("http_request", 200, "/v1/models")]


async def test_a_path_outside_the_table_is_still_litestars(gateway_app):
    """Only exact matches are taken: anything else is routed (and refused) by Litestar as before."""
    response = await gateway_app.get("/v1/chat/completions", headers=gateway_app.key_headers)
    assert response.status_code == 405 and response.json()["error"]["message"], response.text


def _route_handler(path: str = "/v1/chat/completions"):
    app = create_app(Settings(), supervise=False)
    return app, next(handler for method, route, handler in route_table(app) if (method, route) == ("POST", path))


async def _litestar_sends(app, handler, response) -> list[dict]:
    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "query_string": b"", "app": app,
             "state": {}, "path_params": {}, "route_handler": handler}
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    asgi = await handler.to_response(app=app, data=response, request=Request(scope))
    await asgi(scope, None, send)
    return sent


@pytest.mark.parametrize("response", [
    Response(b'{"ok":true}', media_type="application/json"),
    Response(b"{}", media_type=MediaType.JSON, status_code=429,
             headers={"Retry-After": "3", "X-RateLimit-Remaining-Requests": "0"}),
    Response(b"hello", media_type="text/plain", status_code=400),
    Response(b"", status_code=499),
    Response(b"{}", headers={"Content-Type": "application/problem+json", "content-length": "2"}),
    Response(b"{}"),  # the route's own media type
], ids=["json", "enum-media-type-headers", "text-charset", "empty-499", "own-content-headers", "default-media"])
async def test_a_plain_response_is_sent_exactly_as_litestar_sends_it(response):
    app, handler = _route_handler()
    status, headers, body = _plain(response, handler)
    assert [{"type": "http.response.start", "status": status, "headers": headers},
            {"type": "http.response.body", "body": body, "more_body": False}] == await _litestar_sends(
        app, handler, response)


@pytest.mark.parametrize("response", [
    Stream(iter([b"x"])),
    Response(b"{}", cookies=[Cookie("session", "1")]),
    Response(b"{}", background=BackgroundTask(print)),
    Response({"a": 1}),  # content Litestar must render
    Response(b"", status_code=204),
], ids=["stream", "cookies", "background", "not-bytes", "no-body-status"])
def test_anything_else_is_left_to_litestar(response):
    _, handler = _route_handler()
    assert _plain(response, handler) is None


def test_every_generation_route_sends_plain_responses_itself():
    app = create_app(Settings(), supervise=False)
    assert all(layers_add_nothing(handler) for _, _, handler in route_table(app)
               if handler is not None and handler.opt.get("direct"))


async def _after(response):
    return response


@pytest.mark.parametrize("layer", [{"response_headers": {"X-Layer": "1"}},
                                   {"response_cookies": [Cookie("session", "1")]},
                                   {"after_request": _after},
                                   {"background": BackgroundTask(print)}],
                         ids=["headers", "cookies", "after-request", "background"])
def test_a_route_whose_layers_add_to_its_responses_leaves_them_to_litestar(layer):
    @post("/odd", opt=DIRECT, **layer)
    async def odd(request: Request) -> Response:
        return Response(b"{}")

    Litestar([odd])  # resolves the handler's layers
    assert not layers_add_nothing(odd)
