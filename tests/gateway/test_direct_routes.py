"""The generation routes are answered ahead of Litestar's router (gateway/direct_routes.py): every one of them and
nothing else, through the same middlewares, with one log line per request. Their answers themselves (statuses,
envelopes, request ids, bodies, streams) are what every other gateway test checks, all through this path."""

from __future__ import annotations

import pytest
import structlog
from litestar import Litestar, Request, post
from structlog.testing import capture_logs

from gateway.app import create_app
from gateway.config import Settings
from gateway.direct_routes import DIRECT, serve_directly
from tests.gateway.generation_bodies import BODIES, body
from tests.gateway.route_table import route_table

GENERATION = {("POST", path) for path in BODIES} | {
    ("PUT", "/generate"), ("POST", "/"), ("POST", "/v1/completions/generate_stream"),
    ("POST", "/dedicated/v1/completions"), ("POST", "/dedicated/v1/chat/completions")}


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
async def test_a_generation_request_is_one_log_line_with_its_outcome_and_http_status(gateway, path):
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        response = await gateway.post(path, json=body(path), headers=gateway.key_headers)
    assert response.status_code == 200, response.text
    lines = [line for line in logs if line["event"] in ("request_done", "http_request")]
    assert len(lines) == 1 and lines[0]["event"] == "request_done", lines
    line = lines[0]
    assert (line["http_status"], line["status"], line["method"], line["path"]) == (200, "ok", "POST", path)
    assert line["request_id"] == response.headers["x-request-id"] and line["completion_tokens"] > 0


async def test_a_refused_generation_logs_its_error_and_status(gateway):
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        response = await gateway.post("/v1/chat/completions", json=body("/v1/chat/completions", temperature=9),
                                      headers=gateway.key_headers)
    assert response.status_code == 422, response.text
    done = [line for line in logs if line["event"] == "request_done"]
    assert len(done) == 1 and (done[0]["http_status"], done[0]["status"]) == (422, "rejected"), done
    assert done[0]["error"]


async def test_any_other_request_keeps_the_access_line(gateway):
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        response = await gateway.get("/v1/models", headers=gateway.key_headers)
    assert response.status_code == 200
    lines = [line for line in logs if line["event"] in ("request_done", "http_request")]
    assert [(line["event"], line["status"], line["path"]) for line in lines] == [("http_request", 200, "/v1/models")]


async def test_a_path_outside_the_table_is_still_litestars(gateway):
    """Only exact matches are taken: anything else is routed (and refused) by Litestar as before."""
    response = await gateway.get("/v1/chat/completions", headers=gateway.key_headers)
    assert response.status_code == 405 and response.json()["error"]["message"], response.text
