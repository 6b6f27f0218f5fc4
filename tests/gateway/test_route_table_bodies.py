"""Every route of the application that takes a body, times every kind of malformed body: a 4xx in the route's
own envelope whose message names the problem, through the real `sluice serve`, which stays healthy.

The routes come from the app's own route table, so a route added later is covered without anyone remembering
to add it here (a new route outside the OpenAI envelope only needs its envelope named in route_table.py).
"""

from __future__ import annotations

import httpx
import pytest

from common.json_body import read_optional_json
from gateway.config import Settings
from gateway.edge.app import create_app
from testkit.sluice import MODEL, running_sluice
from tests.gateway.route_table import envelope, route_table

pytestmark = pytest.mark.slow

ADMIN_KEY = "route-table-admin-key-0123456789abcdef"
MAX_BODY = 4 * 1024 * 1024
JSON = "application/json"
BODY_METHODS = {"POST", "PUT", "PATCH"}
MALFORMED = {  # name: (body, content type, status, words the message must contain)
    "invalid UTF-8": (b'{"prompt": "\xff\xfe", "text": "\xff", "inputs": "\xfe"}', JSON, 400, "UTF-8"),
    "5,000 nested arrays": (b"[" * 5000 + b"]" * 5000, JSON, 400, "deeper than"),
    "5,000 nested objects": (b'{"a":' * 5000 + b"1" + b"}" * 5000, JSON, 400, "deeper than"),
    "NaN": (b'{"prompt": "x", "temperature": NaN}', JSON, 400, "NaN"),
    "Infinity": (b'{"prompt": "x", "max_tokens": Infinity}', JSON, 400, "Infinity"),
    "trailing garbage": (b'{"prompt": "x"} trailing', JSON, 400, "trailing"),
    "empty": (b"", JSON, 400, "empty"),
    "not JSON": (b"{nope", JSON, 400, "not valid JSON"),
    "lone surrogate": (b'{"prompt": "\\ud800"}', JSON, 400, "not valid JSON"),
    "number out of range": (b'{"n": 1e999}', JSON, 400, "out of range"),
    "form content type": (b'{"prompt": "x"}', "application/x-www-form-urlencoded", 415, "Content-Type"),
    "text content type": (b'{"prompt": "x"}', "text/plain", 415, "Content-Type"),
    "over max_body_bytes": (b'{"prompt": "' + b"x" * MAX_BODY + b'"}', JSON, 413, "exceeds"),
}


def body_routes() -> list[tuple[str, str, bool]]:
    """(method, path, whether an empty body is allowed) of every route that takes a body."""
    found = []
    for method, path, handler in route_table(create_app(Settings(max_body_bytes=MAX_BODY))):
        # forms: tests/gateway/dashboard; multipart uploads (POST /v1/files): tests/security/test_batches.py
        if method in BODY_METHODS and not path.startswith("/dashboard") and not handler.opt.get("multipart"):
            provider = handler.resolve_dependencies().get("payload")
            found.append((method, path, provider is not None and provider.dependency is read_optional_json))
    return found


ROUTES = body_routes()


def test_the_route_table_has_every_body_route():
    paths = {path for _, path, _ in ROUTES}
    assert {"/v1/completions", "/v1/chat/completions", "/serverless/v1/completions", "/v1/generate", "/generate",
            "/generate_stream", "/", "/tokenize", "/detokenize", "/v1/completions/generate", "/admin/keys",
            "/admin/keys/x/rotate", "/admin/teams/x"} <= paths
    assert ("PUT", "/generate", False) in ROUTES


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    # hundreds of refusals back to back on one key: their shapes are tested, not the refusal budget
    with running_sluice(tmp_path_factory.mktemp("bodies"), config="rejections_per_minute = 1000000\n",
                        env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as running:
        yield running


def message_of(path: str, response: httpx.Response) -> str:
    error = envelope(path, response.json())
    # Anthropic names a body over the size its own way (`request_too_large`)
    assert error["kind"] in ("validation", "invalid_request_error", "request_too_large", None), (path, response.text)
    return error["message"]


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_every_body_route_refuses_malformed_bodies(server, case):
    raw, content_type, status, named = MALFORMED[case]
    headers = {"authorization": f"Bearer {ADMIN_KEY}", "content-type": content_type}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        for method, path, optional in ROUTES:
            if optional and raw == b"":
                continue  # this route takes an empty body as "no options"
            response = client.request(method, path, content=raw, headers=headers)
            assert response.status_code == status, (method, path, response.status_code, response.text[:300])
            assert named in message_of(path, response), (method, path, response.text[:300])
        assert client.get("/health").status_code == 200


def test_the_server_still_serves_after_the_barrage(server):
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    with httpx.Client(base_url=server.url, timeout=120) as client:
        assert client.get("/health").status_code == 200
        reply = client.post("/v1/completions", headers=headers,
                            json={"model": MODEL, "prompt": "Hello", "max_tokens": 2, "temperature": 0})
        assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
    assert server.process.poll() is None
