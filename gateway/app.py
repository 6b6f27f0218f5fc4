"""The Litestar app factory: composes auth, billing, limits, routing and the dialect routes."""

from __future__ import annotations

import os
import time
from contextlib import asynccontextmanager

import msgspec
import structlog
from litestar import Litestar, Request, Response
from litestar.exceptions import HTTPException
from litestar.openapi import OpenAPIConfig

from auth.routes import admin_router
from auth.service import AuthService
from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.routes import admin_usage_router, usage_router
from gateway.config import Settings
from gateway.errors import SluiceError
from gateway.limits.base import open_limiter
from gateway.logs import request_id_middleware
from gateway.routes import public_routes
from gateway.routing.pool import Router
from gateway.routing.supervisor import Supervisor
from gateway.secrets import load_pepper
from gateway.state import AppState
from billing.wal_home import OrphanSweeper, WalHome

log = structlog.get_logger("gateway")
_json = msgspec.json.Encoder()


def _envelope(status: int, message: str, kind: str, code: str | None) -> Response:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return Response(_json.encode(body), status_code=status, media_type="application/json")


def _http_exception(_: Request, exc: HTTPException) -> Response:
    kind = "invalid_request_error" if exc.status_code < 500 else "internal_error"
    return _envelope(exc.status_code, str(exc.detail), kind, None)


def _sluice_error(_: Request, exc: SluiceError) -> Response:
    return _envelope(exc.status, exc.message, exc.type, exc.code)


def _unexpected(_: Request, exc: Exception) -> Response:
    log.exception("unhandled_error", error=type(exc).__name__)
    return _envelope(500, "internal server error", "internal_error", "internal_error")


def announce(bootstrap) -> None:
    """Clear keys are shown once, on stdout, never logged."""
    if bootstrap.admin_key:
        print(f"Sluice admin key (shown once, store it now): {bootstrap.admin_key}", flush=True)
    if bootstrap.first_key:
        print(f"Sluice API key for team 'default' (shown once): {bootstrap.first_key}", flush=True)


class LazyLedger:
    """The ledger opens in the lifespan, after the routers are built: resolve it per call."""

    def __init__(self, holder: dict):
        self._holder = holder

    def __getattr__(self, name: str):
        return getattr(self._holder["state"].ledger, name)


def principal_for_billing(holder: dict):
    async def authenticate(request: Request):
        try:
            return await holder["state"].authenticate(request)
        except SluiceError as error:  # billing renders HTTPExceptions in its own envelope
            raise HTTPException(status_code=error.status, detail=error.message) from error

    return authenticate


def create_app(settings: Settings, *, supervise: bool = True) -> Litestar:
    router = Router()
    supervisor = Supervisor(settings.data_path)
    holder: dict = {}

    @asynccontextmanager
    async def lifespan(app: Litestar):
        data = settings.data_path
        data.mkdir(parents=True, exist_ok=True)
        auth = await AuthService.open(settings.resolved_database_url, load_pepper(data))
        announce(await auth.bootstrap(os.environ.get("SLUICE_ADMIN_KEY") or None))
        limiter = open_limiter(settings.redis_url or None, fail_open=settings.limiter_fail_open)
        pricing = PricingTable(settings.pricing_file or None, section="pricing")
        wal = WalHome.claim(data, settings.wal_root)
        ledger = (await Ledger.open(settings.resolved_database_url, wal.path, pricing)
                  if settings.ledger_enabled else None)
        sweeper = OrphanSweeper(wal, settings.resolved_database_url, pricing).start() if ledger else None
        state = AppState(settings, router, auth, limiter=limiter, ledger=ledger, started_at=time.time())
        holder["state"] = state
        app.state.sluice = state
        for model in settings.models:
            if model.urls:
                for url in model.urls:
                    router.add_replica(model.name, url)
            elif supervise:
                for index in range(model.replicas):
                    router.add_replica(model.name, supervisor.add(model, index).url)
        await supervisor.start()
        await router.start()
        try:
            yield
        finally:
            await router.close()
            await supervisor.stop()
            await limiter.close()
            if ledger is not None:
                await sweeper.stop()
                await ledger.close()
                wal.release()
            await auth.close()
            log.info("gateway_stopped", workers=len(supervisor.workers))

    usage = ([usage_router(LazyLedger(holder), principal_for_billing(holder)),
              admin_usage_router(LazyLedger(holder), principal_for_billing(holder))]
             if settings.ledger_enabled else [])
    return Litestar(
        route_handlers=[*public_routes(), admin_router(lambda: holder["state"].auth), *usage],
        lifespan=[lifespan],
        middleware=[request_id_middleware],
        exception_handlers={HTTPException: _http_exception, SluiceError: _sluice_error, Exception: _unexpected},
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(title="Sluice", version="0.1.0", path="/openapi"),
        debug=False,
    )
