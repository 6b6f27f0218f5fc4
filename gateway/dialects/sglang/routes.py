"""SGLang helper routes: model/server info, a generation health check, detokenize; the SGLang side of the
paths it shares with TGI (`/generate`, `/tokenize`, see `dialects.shared_paths`)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Stream

from gateway.dialects.base import check, convert, with_default_model
from gateway.dialects.openapi import documented
from gateway.dialects.sglang.dialect import SGLANG
from gateway.dialects.sglang.docs import ERRORS, ErrorDoc, ModelInfoDoc
from gateway.dialects.sglang.request import BodyInvalid, DetokenizeBody, TokenizeBody
from gateway.errors import SluiceError, ValidationFailed
from gateway.generation import error_response, handle_generation, read_json
from gateway.proxy import stream_events
from gateway.state import AppState
from gateway.tokenizer import detokenize as worker_detokenize
from gateway.tokenizer import ready_replica, tokenize
from common.protocol import (
    DetokenizeResponse,
    Done,
    Error,
    GenerateRequest,
    SamplingParams,
)

_json = msgspec.json.Encoder()


def _json_response(body: Any, status: int = 200) -> Response:
    return Response(_json.encode(body), status_code=status, media_type="application/json")


async def generate_sglang(request: Request, payload: Any) -> Response | Stream:
    state: AppState = request.app.state.sluice
    return await handle_generation(request, SGLANG, "/generate", with_default_model(state.router, payload))


async def tokenize_sglang(request: Request, payload: Any) -> Response:
    """`POST /tokenize` with `text` (or `prompt`): SGLang's `{tokens, count, max_model_len}`."""
    state: AppState = request.app.state.sluice
    try:
        await state.authenticate(request)
        try:
            body = convert(payload, TokenizeBody)
            text = body.text if body.text is not None else body.prompt
            check(text is not None and text != [], "`text` is required", "text")
        except ValidationFailed as error:
            raise BodyInvalid(error.message, param=error.param) from error
        pool, _ = ready_replica(state.router, body.model)
        texts = [text] if isinstance(text, str) else text
        tokens = [[span.id for span in await tokenize(state.router, pool.name, t)] for t in texts]
        info = pool.info()
    except SluiceError as error:
        return error_response(SGLANG, error)
    single = isinstance(text, str)
    return _json_response({"tokens": tokens[0] if single else tokens,
                           "count": len(tokens[0]) if single else [len(t) for t in tokens],
                           "max_model_len": info.max_context if info else 0})


@get("/get_model_info", summary="SGLang: the served model", tags=["SGLang"],
     operation_class=documented(None, {200: ("Model info", ModelInfoDoc), 503: ("No ready worker", ErrorDoc)}))
async def get_model_info(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    try:
        pool, _ = ready_replica(state.router)
    except SluiceError as error:
        return error_response(SGLANG, error)
    return _json_response({"model_path": pool.name, "tokenizer_path": pool.name, "is_generation": True,
                           "preferred_sampling_params": None, "weight_version": "default"})


@get("/get_server_info", summary="SGLang: server arguments and limits", tags=["SGLang"],
     operation_class=documented(None, {200: ("Server info", dict)}))
async def get_server_info(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    models = []
    for name, pool in state.router.pools.items():
        info = pool.info()
        models.append({"model_path": name, "ready": pool.ready, "replicas": len(pool.replicas),
                       "context_length": info.max_context if info else None,
                       "max_running_requests": info.max_rows if info else None,
                       "dtype": info.model_dtype if info else None, "device": info.device if info else None})
    return _json_response({"version": "sluice-0.1.0", "served_models": models,
                           "model_path": models[0]["model_path"] if models else None})


@get("/health_generate", summary="SGLang: 200 when a one-token generation succeeds, else 503", tags=["SGLang"],
     operation_class=documented(None, {200: ("Healthy", None), 503: ("Unhealthy", None)}))
async def health_generate(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    try:
        pool, _ = ready_replica(state.router)
        probe = GenerateRequest(request_id=f"health-{id(request)}", model=pool.name, prompt_ids=[0],
                                params=SamplingParams(max_tokens=1, temperature=0.0))
        ok = False
        async for event in stream_events(pool, probe):
            ok = ok or isinstance(event, Done)
            if isinstance(event, Error):
                break
    except SluiceError:
        ok = False
    return Response(b"", status_code=200 if ok else 503)


@post("/detokenize", status_code=200, summary="SGLang: token ids -> text", tags=["SGLang"],
      operation_class=documented(DetokenizeBody, {200: ("Text", DetokenizeResponse), **ERRORS}))
async def detokenize(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    try:
        await state.authenticate(request)
        payload = await read_json(request, state.settings.max_body_bytes)
        try:
            body = convert(payload, DetokenizeBody)
            check(all(t >= 0 for t in body.tokens), "tokens must be non-negative token ids", "tokens")
            text = await worker_detokenize(state.router, body.model, body.tokens,
                                           body.skip_special_tokens is not False)
        except ValidationFailed as error:
            raise BodyInvalid(error.message, param=error.param) from error
    except SluiceError as error:
        return error_response(SGLANG, error)
    return Response(text, media_type="application/json")


def routes() -> list:
    return [get_model_info, get_server_info, health_generate, detokenize]
