"""Every auth test runs against SQLite (a file in tmp_path) and PostgreSQL (a fresh database per test): the
`store_url` fixture, in tests/conftest.py (the endpoint tests use it too)."""

from __future__ import annotations

import contextlib

import pytest
from litestar import Litestar, Request, get
from litestar.testing import AsyncTestClient

from auth import AuthService, Principal
from gateway.admin.identity import admin_router
from gateway.authentication.middleware import PUBLIC, authentication
from gateway.serving.dialect import DEFAULT
from testkit.databases import fresh_database
from tests.auth.helpers import PEPPER


@pytest.fixture
async def postgres_url(postgres):
    async with fresh_database(postgres, "auth") as url:
        yield url


@pytest.fixture
async def service(store_url):
    svc = await AuthService.open(store_url, PEPPER)
    yield svc
    await svc.close()


@pytest.fixture
async def boot(service):
    return await service.bootstrap(None)


def build_app(store_url: str, **options) -> Litestar:
    """The admin router plus one tiny authenticated route and one public one, composed as the gateway composes
    them: the authentication middleware, the service in `app.state.auth`, the gateway's error envelope.

    AsyncTestClient runs the app on its own event loop (a portal thread), so the service is opened
    in the app's lifespan there.
    """

    @get("/v1/whoami")
    async def whoami(request: Request, model: str | None = None) -> dict:
        principal: Principal = request.user
        if model is not None:
            request.app.state.auth.check_model(principal, model)
        return {"key_id": principal.key_id, "team_id": principal.team_id, "user_id": principal.user_id,
                "is_admin": principal.is_admin, "models": list(principal.models)}

    @get("/v1/open", opt=PUBLIC)
    async def open_route() -> dict:
        return {"ok": True}

    @contextlib.asynccontextmanager
    async def lifespan(app: Litestar):
        app.state.auth = await AuthService.open(store_url, PEPPER, **options)
        app.state.boot = await app.state.auth.bootstrap(None)
        try:
            yield
        finally:
            await app.state.auth.close()

    return Litestar([whoami, open_route, admin_router()], middleware=[authentication()],
                    exception_handlers=DEFAULT.exception_handlers(), lifespan=[lifespan])


@pytest.fixture
async def client(store_url):
    app = build_app(store_url)
    async with AsyncTestClient(app=app) as c:
        c.boot = app.state.boot
        c.admin_headers = {"Authorization": f"Bearer {c.boot.admin_key}"}
        yield c
