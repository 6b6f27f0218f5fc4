"""SGLang helper routes: model/server info, a generation health check, detokenize; the SGLang side of the
paths it shares with TGI (`/generate`, `/tokenize`, see `dialects.shared_paths`)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Router, get, post
from litestar.di import Provide
from litestar.response import Response

from auth.middleware import PUBLIC
from gateway.dialects.base import convert
from gateway.dialects.openapi import documented
from gateway.dialects.sglang.dialect import SGLANG
from gateway.dialects.sglang.docs import ERRORS, ErrorDoc, ModelInfoDoc
from gateway.dialects.sglang.request import BodyInvalid, DetokenizeBody, TokenizeBody
from gateway.errors import SluiceError, ValidationFailed
from gateway.proxy import stream_events
from gateway.services import Services
from gateway.tokenizer import detokenize as worker_detokenize
from gateway.tokenizer import ready_replica, tokenize
from common.json_body import read_json
from common.protocol import (
    DetokenizeResponse,
    Done,
    Error,
    GenerateRequest,
    SamplingParams,
)


def body_of(payload: Any, kind: type):
    """A helper route's body: a mismatch is SGLang's 400 body error, naming the field."""
    try:
        return convert(payload, kind)
    except ValidationFailed as error:
        raise BodyInvalid(error.message, param=error.param) from error


async def tokenize_sglang(services: Services, payload: Any) -> dict:
    """`POST /tokenize` with `text` (or `prompt`): SGLang's `{tokens, count, max_model_len}`."""
    body = body_of(payload, TokenizeBody)
    text = body.text if body.text is not None else body.prompt
    if text is None or text == []:
        raise BodyInvalid("`text` is required", param="text")
    pool, _ = ready_replica(services.router, body.model)
    texts = [text] if isinstance(text, str) else text
    tokens = [[span.id for span in await tokenize(services.router, pool.name, t)] for t in texts]
    info = pool.info()
    single = isinstance(text, str)
    return {"tokens": tokens[0] if single else tokens, "count": len(tokens[0]) if single else [len(t) for t in tokens],
            "max_model_len": info.max_context if info else 0}


@get("/get_model_info", summary="SGLang: the served model", tags=["SGLang"], opt=PUBLIC,
     operation_class=documented(None, {200: ("Model info", ModelInfoDoc), 503: ("No ready worker", ErrorDoc)}))
async def get_model_info(services: Services) -> dict:
    pool, _ = ready_replica(services.router)
    return {"model_path": pool.name, "tokenizer_path": pool.name, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default"}


@get("/get_server_info", summary="SGLang: server arguments and limits", tags=["SGLang"], opt=PUBLIC,
     operation_class=documented(None, {200: ("Server info", dict)}))
async def get_server_info(services: Services) -> dict:
    models = []
    for name, pool in services.router.pools.items():
        info = pool.info()
        models.append({"model_path": name, "ready": pool.ready, "replicas": len(pool.replicas),
                       "context_length": info.max_context if info else None,
                       "max_running_requests": info.max_rows if info else None,
                       "dtype": info.model_dtype if info else None, "device": info.device if info else None})
    return {"version": "sluice-0.1.0", "served_models": models,
            "model_path": models[0]["model_path"] if models else None}


@get("/health_generate", summary="SGLang: 200 when a one-token generation succeeds, else 503", tags=["SGLang"],
     opt=PUBLIC, operation_class=documented(None, {200: ("Healthy", None), 503: ("Unhealthy", None)}))
async def health_generate(request: Request, services: Services) -> Response:
    try:
        pool, _ = ready_replica(services.router)
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
async def detokenize(services: Services, payload: Any) -> Response:
    body = body_of(payload, DetokenizeBody)
    if not all(t >= 0 for t in body.tokens):
        raise BodyInvalid("tokens must be non-negative token ids", param="tokens")
    try:
        text = await worker_detokenize(services.router, body.model, body.tokens, body.skip_special_tokens is not False)
    except ValidationFailed as error:
        raise BodyInvalid(error.message, param=error.param) from error
    return Response(text, media_type="application/json")


def router() -> Router:
    return Router(path="/", route_handlers=[get_model_info, get_server_info, health_generate, detokenize],
                  dependencies={"payload": Provide(read_json)}, exception_handlers=SGLANG.exception_handlers())
