"""Two probes. `GET /livez` (liveness): 200 whenever the process runs and its event loop answers; it reads
no model, replica or database state, so load balancers and the ECS health check use it and a GPU cold start or a
failed endpoint never gets a healthy gateway replaced. `GET /health` (readiness, the rule of
gateway/serving/readiness.py): 200 once every endpoint is ready or may sleep (min_replicas 0) and has not failed,
else 503. Anyone gets the verdict alone; endpoint names (private
endpoints among them) and their states are for the operator: with an admin key the body lists each endpoint's
state and why any is not ready. While the shared rate limiter's Redis is away the body says so (`limiter`: the
outage policy in force); `/health` stays 200 under the `local` and `open` policies (requests are served) and is
503 under `closed` (every generation would be refused)."""

from __future__ import annotations

import msgspec
from litestar import Request, Response, get

from common.errors import retry_after_header
from gateway.authentication.middleware import PUBLIC, is_admin_caller
from gateway.errors import UNREADY_RETRY_S
from gateway.serving.readiness import readiness
from gateway.serving.services import Services

_json = msgspec.json.Encoder()


_ALIVE = _json.encode({"status": "alive"})


@get("/livez", summary="200 while the gateway process runs and answers (liveness)", opt=PUBLIC)
async def livez() -> Response:
    return Response(_ALIVE, media_type="application/json")


@get("/health", summary="200 once every endpoint is ready, or scaled to zero on purpose (detail: admin key)",
     opt=PUBLIC)
async def health(request: Request, services: Services) -> Response:
    verdict = readiness(services)
    body: dict = {"status": "unavailable" if not verdict.ready else "degraded" if verdict.limiter else "ok"}
    if verdict.limiter:
        body["limiter"] = verdict.limiter
    admin = await is_admin_caller(request)
    if admin:
        body["endpoints"] = {status.name: status.state for status in verdict.states}
    if reason := verdict.reason(admin):
        body["reason"] = reason
    if not verdict.ready:
        return Response(_json.encode(body), status_code=503, media_type="application/json",
                        headers=retry_after_header(UNREADY_RETRY_S))
    return Response(_json.encode(body), media_type="application/json")
