"""`GET /metrics` (TGI's route): the Prometheus text of the gateway's registry (`gateway.metrics`).

It tells the operator about every team and every endpoint, so it is not public: the caller sends the
`metrics_token` setting as a bearer token (what a Prometheus scrape config's `authorization` sends) or an
admin key; anything else is the usual 401 / 403, and a wrong token counts as a failed key for the
failed-auth throttle. The text is rendered on a thread: a scrape never holds the event loop that serves
every tenant's streams."""

from __future__ import annotations

import asyncio
import hmac

from litestar import Request, Response, get
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from auth.errors import AuthError
from auth.policy import uses_admin_api
from common.headers import header
from gateway.authentication.middleware import PUBLIC, principal
from gateway.metrics import REGISTRY
from gateway.serving.services import Services


def _is_scrape_token(authorization: str | None, token: str) -> bool:
    if not token or authorization is None:
        return False
    scheme, _, sent = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), token.encode())


@get("/metrics", summary="Prometheus metrics (the metrics token or an admin key)", tags=["TGI"], opt=PUBLIC)
async def prometheus_metrics(request: Request, services: Services) -> Response:
    if not _is_scrape_token(header(request, b"authorization"), services.settings.metrics_token):
        caller = await principal(request)  # 401 without a key or with a wrong one
        if not uses_admin_api(caller.is_admin):
            raise AuthError.denied("GET /metrics needs the metrics token or an admin key.")
    return Response(await asyncio.to_thread(generate_latest, REGISTRY), media_type=CONTENT_TYPE_LATEST)
