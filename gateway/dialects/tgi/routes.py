"""TGI routes: `/generate_stream`, the compat `POST /`, `/info`; the TGI side of the paths it shares with
SGLang (`/generate`, `/tokenize`, see `dialects.shared_paths`)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Router, get, post
from litestar.response import Response, Stream

from common.protocol import TokenSpan
from gateway.authentication.middleware import PUBLIC, optional_principal
from gateway.dialects.fast_path import DIRECT
from gateway.dialects.tgi.dialect import TGI
from gateway.dialects.tgi.docs import COMPAT_DOC, INFO_DOC, TGI_STREAM_DOC
from gateway.dialects.tgi.request import MAX_BEST_OF, MAX_STOP_SEQUENCES
from gateway.errors import Unavailable
from gateway.serving.pipeline import handle_generation
from gateway.serving.services import Services
from gateway.serving.tokenize import tokenizer_call

GENERATE = TGI(100, stream=False)
GENERATE_STREAM = TGI(100, stream=True)
COMPAT = TGI(100, compat=True)


async def tokenize_tgi(services: Services, request: Request, payload: Any) -> list[TokenSpan]:
    """`POST /tokenize` with `inputs`: TGI's `[{id, text, start, stop}]`."""
    parsed = GENERATE.parse(payload, "/tokenize")
    async with tokenizer_call(services, request, parsed.model or None) as tokenizer:
        return await tokenizer.tokenize(parsed.requests[0].prompt or "")


@post("/generate_stream", status_code=200, summary="TGI: stream generated tokens", tags=["TGI"],
      operation_class=TGI_STREAM_DOC, opt=DIRECT)
async def generate_stream(request: Request, services: Services) -> Response | Stream:
    return await handle_generation(request, services, GENERATE_STREAM, "/generate_stream")


@post("/", status_code=200, summary="TGI compat: generate, or stream when `stream` is true", tags=["TGI"],
      operation_class=COMPAT_DOC, opt=DIRECT)
async def compat_generate(request: Request, services: Services) -> Response | Stream:
    return await handle_generation(request, services, COMPAT, "/")


@get("/info", summary="TGI: model and router information", tags=["TGI"], operation_class=INFO_DOC, opt=PUBLIC)
async def info(request: Request, services: Services) -> dict:
    """Public, as TGI's; a caller's key (when sent) sees only what it may call."""
    pool = services.router.pool(services.described_model(await optional_principal(request)))
    model = pool.info() if pool is not None else None
    if model is None:
        raise Unavailable("no ready worker; retry shortly")
    return {"model_id": model.model_id, "model_sha": None, "model_dtype": model.model_dtype,
            "model_device_type": model.device, "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": model.max_rows, "max_best_of": MAX_BEST_OF,
            "max_stop_sequences": MAX_STOP_SEQUENCES, "max_input_tokens": model.max_context - 1,
            "max_total_tokens": model.max_context, "validation_workers": 1, "max_client_batch_size": 1,
            "router": "sluice", "version": "0.1.0", "sha": None, "docker_label": None}


def router() -> Router:
    return Router(path="/", route_handlers=[generate_stream, compat_generate, info],
                  exception_handlers=GENERATE.exception_handlers())
