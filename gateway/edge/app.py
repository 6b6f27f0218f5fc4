"""The Litestar app factory: mounts every dialect room, the admin and usage APIs, and the cross-cutting
parts: the services plugin (lifespan + dependency injection), the access log (request ids, one line per
request), the request scope (which settles what a generation request holds once its response is over), API-key
authentication (`request.user` is the caller's Principal) and the OpenAI envelope for everything no
dialect claims. The generation routes are answered ahead of Litestar's router (`gateway.dialects.fast_path`)."""

from __future__ import annotations

from litestar import Litestar
from litestar.openapi import OpenAPIConfig

from gateway.admin.endpoints import admin_endpoints_router, visible_endpoints
from gateway.admin.identity import admin_router
from gateway.admin.team import team_router
from gateway.admin.usage import admin_usage_router, usage_router
from gateway.authentication.middleware import authentication, require_admin
from gateway.batches import anthropic_routes as message_batches
from gateway.batches import openai_routes as batch_files
from gateway.batches.dashboard_page import dashboard_batches_router
from gateway.config import Settings
from gateway.dashboard.render import template_config
from gateway.dashboard.routes import dashboard_router, static_router
from gateway.dialects import shared_paths
from gateway.dialects.anthropic import routes as anthropic
from gateway.dialects.datacrunch import routes as datacrunch
from gateway.dialects.fast_path import serve_directly
from gateway.dialects.friendli import routes as friendli
from gateway.dialects.monster import routes as monster
from gateway.dialects.openai import routes as openai
from gateway.dialects.responses import routes as responses
from gateway.dialects.sglang import routes as sglang
from gateway.dialects.tgi import routes as tgi
from gateway.edge import health, metrics_route
from gateway.edge.access_log import access_log_middleware, answer_request_id
from gateway.edge.lifespan import GatewayServices
from gateway.edge.write_timeout import write_timeout_middleware
from gateway.serving.dialect import DEFAULT
from gateway.serving.request_scope import request_scope_middleware

OPENAPI_PATH = "/openapi"


def create_app(settings: Settings, *, supervise: bool = True, ledger: bool = True) -> Litestar:
    """`ledger=False` keeps no usage records and serves no usage API: only bench/ledger_gateway.py's baseline."""
    rooms = [openai.router(), friendli.router(), monster.router(), tgi.router(), datacrunch.router(),
             sglang.router(), shared_paths.router(), anthropic.router(),
             responses.router(), batch_files.router(settings.batches.max_file_bytes), message_batches.router()]
    usage = ([usage_router(), admin_usage_router(guards=[require_admin]), dashboard_router(),
              dashboard_batches_router(), static_router()]
             if ledger else [])
    # outermost first; the direct routes run the same ones, then authenticate themselves. The request scope sits
    # inside the access log, so a request is settled before its line is written
    wrappers = [access_log_middleware, request_scope_middleware,
                write_timeout_middleware(settings.stream_write_timeout_s)]
    app = Litestar(
        route_handlers=[*rooms, health.livez, health.health, metrics_route.prometheus_metrics, admin_router(),
                        team_router(), admin_endpoints_router(), visible_endpoints, *usage],
        plugins=[GatewayServices(settings, supervise=supervise, ledger=ledger)],
        middleware=[*wrappers, authentication(exclude=[f"^{OPENAPI_PATH}(/|$)"])],
        before_send=[answer_request_id],
        exception_handlers=DEFAULT.exception_handlers(),
        request_max_body_size=settings.max_body_bytes,
        template_config=template_config(),
        openapi_config=OpenAPIConfig(title="Sluice", version="0.1.0", path=OPENAPI_PATH),
        debug=False,
    )
    serve_directly(app, wrappers)
    return app
