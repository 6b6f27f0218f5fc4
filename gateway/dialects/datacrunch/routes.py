"""DataCrunch (Verda) inference endpoints: `POST /v1/completions/generate` and `/generate_stream`, and
`GET /v1/completions/health`.

A room of its own because it is a public API of its own (its paths, a 20-token default, an optional `model`,
its health reply, its SDK), while its bodies, replies and errors are TGI's: the routes serve the TGI dialect.
"""

from __future__ import annotations

import msgspec
from litestar import Request, Router, get, post
from litestar.response import Response, Stream

from common.errors import retry_after_header
from gateway.authentication.middleware import PUBLIC, is_admin_caller
from gateway.dialects.fast_path import DIRECT
from gateway.dialects.tgi.dialect import TGI
from gateway.dialects.tgi.docs import TGI_DOC, TGI_STREAM_DOC
from gateway.errors import UNREADY_RETRY_S
from gateway.serving.pipeline import handle_generation
from gateway.serving.readiness import readiness
from gateway.serving.services import Services

DEFAULT_MAX_NEW_TOKENS = 20
GENERATE = TGI(DEFAULT_MAX_NEW_TOKENS, stream=False, name="datacrunch")
GENERATE_STREAM = TGI(DEFAULT_MAX_NEW_TOKENS, stream=True, name="datacrunch")
_json = msgspec.json.Encoder()


@post("/v1/completions/generate", status_code=200, summary="DataCrunch: generate (TGI dialect with `model`)",
      tags=["DataCrunch"], operation_class=TGI_DOC, opt=DIRECT)
async def generate(request: Request, services: Services) -> Response | Stream:
    return await handle_generation(request, services, GENERATE, "/v1/completions/generate")


@post("/v1/completions/generate_stream", status_code=200, summary="DataCrunch: stream generated tokens",
      tags=["DataCrunch"], operation_class=TGI_STREAM_DOC, opt=DIRECT)
async def generate_stream(request: Request, services: Services) -> Response | Stream:
    return await handle_generation(request, services, GENERATE_STREAM, "/v1/completions/generate_stream")


@get("/v1/completions/health", summary="DataCrunch: 200 when the gateway is ready (the rule of GET /health)",
     tags=["DataCrunch"], opt=PUBLIC)
async def health(request: Request, services: Services) -> Response:
    verdict = readiness(services)
    if not verdict.ready:  # which endpoints (private ones among them) only for an admin key, as on GET /health
        body = {"error": verdict.reason(await is_admin_caller(request)), "error_type": "healthcheck"}
        return Response(_json.encode(body), status_code=503, media_type="application/json",
                        headers=retry_after_header(UNREADY_RETRY_S))
    return Response(_json.encode({"status": "ok"}), media_type="application/json")


def router() -> Router:
    return Router(path="/", route_handlers=[generate, generate_stream, health],
                  exception_handlers=GENERATE.exception_handlers())
