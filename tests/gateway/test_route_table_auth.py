"""Authentication over the app's own route table: every route needs a key except the public ones listed
here (so a new route is authenticated unless someone decides otherwise), and a missing or wrong key is a
401 in the envelope of the route's own dialect. Through the real ASGI app and its lifespan (SQLite auth and
ledger in a temporary data dir; the model's worker address answers nothing, which no check here needs)."""

from __future__ import annotations

import pytest
from litestar.testing import AsyncTestClient

from gateway.config import Settings
from gateway.edge.app import create_app
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from testkit.servers import free_port
from tests.gateway.route_table import envelope, route_table

PUBLIC = {"/livez", "/health", "/info", "/get_model_info", "/get_server_info", "/health_generate",
          "/v1/completions/health"}
DASHBOARD = "/dashboard"  # its pages sign in by the dashboard session instead (tests/gateway/dashboard)
OPEN_PAGES = {"/dashboard", "/dashboard/login", "/dashboard/static/x",  # home redirects, sign-in, files
              # what people follow before they have a session: e-mailed links, the reset form, the OIDC round trip
              "/dashboard/sign-in/link", "/dashboard/forgot", "/dashboard/reset", "/dashboard/invite",
              "/dashboard/oidc/start", "/dashboard/oidc/callback"}


@pytest.fixture
def rejections_per_minute() -> int:
    return 10_000  # every route is asked once without a key: more refusals than an address may make by default


@pytest.fixture
async def client(tmp_path, rejections_per_minute):
    model = EndpointSpec(name="m", provisioner=StaticProvisioning(urls=[f"http://127.0.0.1:{free_port()}"]))
    app = create_app(Settings(data_dir=str(tmp_path), models=[model], rejections_per_minute=rejections_per_minute),
                     supervise=False)
    async with AsyncTestClient(app=app) as test_client:
        yield test_client


def assert_401_envelope(method: str, path: str, response) -> None:
    assert response.status_code == 401, (method, path, response.status_code, response.text)
    error = envelope(path, response.json())
    assert error["message"] and error["kind"] in ("authentication", "authentication_error", None), (path, error)


async def test_every_route_but_the_public_ones_needs_a_key(client):
    public = set()
    for method, path, _ in route_table(create_app(Settings(), supervise=False)):
        response = await client.request(method, path, content=b"{}", follow_redirects=False)
        if path.startswith(DASHBOARD):
            assert response.status_code < 500, (method, path, response.status_code)
            if method == "GET" and path not in OPEN_PAGES:  # without a session: the sign-in page, nothing else
                # (with where it was going, when it is a page of its own: `next`)
                location = response.headers["location"]
                assert response.status_code == 302 and location.split("?next=")[0] == "/dashboard/login", path
            elif method == "POST":  # not a form of a session (no session, no CSRF token, JSON), or sent to sign in
                signing_in = response.status_code == 302 and response.headers["location"].startswith("/dashboard/login")
                assert response.status_code in (403, 415) or signing_in, (method, path, response.status_code)
            public.add(DASHBOARD)
            continue
        if path.startswith("/openapi") or path in PUBLIC:
            assert response.status_code != 401, (method, path)
            public.add("/openapi" if path.startswith("/openapi") else path)
            continue
        assert_401_envelope(method, path, response)
    assert public == PUBLIC | {"/openapi", DASHBOARD}


async def test_an_unknown_key_is_401_in_each_envelope(client):
    unknown = {"authorization": "Bearer sk-sluice-000000000000-" + "a" * 32}
    for method, path in (("POST", "/v1/completions"), ("POST", "/serverless/v1/chat/completions"),
                         ("POST", "/generate"), ("POST", "/detokenize"), ("GET", "/admin/keys"),
                         ("GET", "/v1/usage"), ("GET", "/info"), ("GET", "/get_model_info"),
                         ("GET", "/get_server_info")):
        assert_401_envelope(method, path, await client.request(method, path, headers=unknown, content=b"{}"))


@pytest.mark.parametrize("rejections_per_minute", [3])
async def test_throttled_client_gets_retry_after_in_each_envelope(client):
    bad = {"authorization": "Bearer sk-sluice-000000000000-" + "b" * 32}
    for _ in range(3):  # the client's rejections_per_minute
        await client.get("/v1/models", headers=bad)
    for method, path in (("GET", "/v1/models"), ("POST", "/generate"), ("POST", "/detokenize")):
        response = await client.request(method, path, headers=bad, content=b"{}")
        assert response.status_code == 429 and int(response.headers["retry-after"]) >= 1, (path, response.text)
