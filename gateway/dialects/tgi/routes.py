"""TGI routes: `/generate_stream`, the compat `POST /`, `/info`; the TGI side of the paths it shares with
SGLang (`/generate`, `/tokenize`, see `dialects.shared_paths`)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Stream

from gateway.dialects.base import with_default_model
from gateway.dialects.tgi.dialect import TGI
from gateway.dialects.tgi.docs import COMPAT_DOC, INFO_DOC, TGI_STREAM_DOC
from gateway.dialects.tgi.request import MAX_BEST_OF, MAX_STOP_SEQUENCES
from gateway.errors import SluiceError, Unavailable
from gateway.generation import error_response, handle_generation, read_json
from gateway.state import AppState
from gateway.tokenizer import tokenize

_json = msgspec.json.Encoder()
GENERATE = TGI(100, stream=False)
GENERATE_STREAM = TGI(100, stream=True)
COMPAT = TGI(100, compat=True)


async def generate_tgi(request: Request, dialect: TGI, path: str, payload: Any = None) -> Response | Stream:
    state: AppState = request.app.state.sluice
    if payload is None:
        try:
            payload = await read_json(request, state.settings.max_body_bytes)
        except SluiceError as error:
            return error_response(dialect, error)
    return await handle_generation(request, dialect, path, with_default_model(state.router, payload))


async def tokenize_tgi(request: Request, payload: Any) -> Response:
    """`POST /tokenize` with `inputs`: TGI's `[{id, text, start, stop}]`."""
    state: AppState = request.app.state.sluice
    try:
        await state.authenticate(request)
        parsed = GENERATE.parse(with_default_model(state.router, payload), "/tokenize")
        spans = await tokenize(state.router, parsed.model, parsed.requests[0].prompt or "")
    except SluiceError as error:
        return error_response(GENERATE, error)
    return Response(_json.encode(spans), media_type="application/json")


@post("/generate_stream", status_code=200, summary="TGI: stream generated tokens", tags=["TGI"],
      operation_class=TGI_STREAM_DOC)
async def generate_stream(request: Request) -> Response | Stream:
    return await generate_tgi(request, GENERATE_STREAM, "/generate_stream")


@post("/", status_code=200, summary="TGI compat: generate, or stream when `stream` is true", tags=["TGI"],
      operation_class=COMPAT_DOC)
async def compat_generate(request: Request) -> Response | Stream:
    return await generate_tgi(request, COMPAT, "/")


@get("/info", summary="TGI: model and router information", tags=["TGI"], operation_class=INFO_DOC)
async def info(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    name = next(iter(state.router.pools), None)
    model = state.router.pool(name).info() if name else None
    if model is None:
        return error_response(GENERATE, Unavailable("no ready worker; retry shortly"))
    body = {"model_id": model.model_id, "model_sha": None, "model_dtype": model.model_dtype,
            "model_device_type": model.device, "model_pipeline_tag": "text-generation",
            "max_concurrent_requests": model.max_rows, "max_best_of": MAX_BEST_OF,
            "max_stop_sequences": MAX_STOP_SEQUENCES, "max_input_tokens": model.max_context - 1,
            "max_total_tokens": model.max_context, "validation_workers": 1, "max_client_batch_size": 1,
            "router": "sluice", "version": "0.1.0", "sha": None, "docker_label": None}
    return Response(_json.encode(body), media_type="application/json")


def routes() -> list:
    return [generate_stream, compat_generate, info]
