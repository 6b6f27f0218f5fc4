"""SGLang helper routes: model/server info, a generation health check, detokenize; the SGLang side of the
paths it shares with TGI (`/generate`, `/tokenize`, see `dialects.shared_paths`)."""

from __future__ import annotations

from typing import Any

from litestar import Request, Router, get, post
from litestar.di import Provide
from litestar.response import Response

from common.json_body import read_json
from common.protocol import DetokenizeResponse
from gateway.authentication.middleware import PUBLIC, optional_principal
from gateway.dialects.openapi import documented
from gateway.dialects.sglang.dialect import SGLANG
from gateway.dialects.sglang.docs import ERRORS, ErrorDoc, ModelInfoDoc
from gateway.dialects.sglang.request import BodyInvalid, DetokenizeBody, TokenizeBody
from gateway.errors import ValidationFailed
from gateway.serving.dialect import convert
from gateway.serving.services import Services
from gateway.serving.tokenize import tokenizer_call


def body_of(payload: Any, kind: type):
    """A helper route's body: a mismatch is SGLang's 400 body error, naming the field."""
    try:
        return convert(payload, kind)
    except ValidationFailed as error:
        raise BodyInvalid(error.message, param=error.param) from error


async def tokenize_sglang(services: Services, request: Request, payload: Any) -> dict:
    """`POST /tokenize` with `text` (or `prompt`): SGLang's `{tokens, count, max_model_len}`."""
    body = body_of(payload, TokenizeBody)
    text = body.text if body.text is not None else body.prompt
    if text is None or text == []:
        raise BodyInvalid("`text` is required", param="text")
    texts = [text] if isinstance(text, str) else text
    async with tokenizer_call(services, request, body.model) as tokenizer:
        tokens = [[span.id for span in await tokenizer.tokenize(t)] for t in texts]
    info = tokenizer.endpoint.pool.described()
    single = isinstance(text, str)
    return {"tokens": tokens[0] if single else tokens, "count": len(tokens[0]) if single else [len(t) for t in tokens],
            "max_model_len": info.max_context if info else 0}


@get("/get_model_info", summary="SGLang: the served model", tags=["SGLang"], opt=PUBLIC,
     operation_class=documented(None, {200: ("Model info", ModelInfoDoc), 401: ("Invalid API key", ErrorDoc),
                                       403: ("Model not allowed for this key", ErrorDoc), 404: ("No model", ErrorDoc)}))
async def get_model_info(request: Request, services: Services) -> dict:
    """Public, as SGLang's; a caller's key (when sent) sees only what it may call. Answered from the endpoint, with
    no worker call (nothing in it is a worker's to say): a scaled-to-zero endpoint is described as it sleeps, and
    an anonymous caller starts no worker."""
    name = services.described_model(await optional_principal(request))
    return {"model_path": name, "tokenizer_path": name, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default"}


@get("/get_server_info", summary="SGLang: server arguments and limits", tags=["SGLang"], opt=PUBLIC,
     operation_class=documented(None, {200: ("Server info", dict), 401: ("Invalid API key", ErrorDoc)}))
async def get_server_info(request: Request, services: Services) -> dict:
    """Every endpoint the caller may see (public ones without a key) and its key may call."""
    models = []
    for status in services.endpoints.callable(await optional_principal(request)):
        name, pool = status.name, services.router.pool(status.name)
        if pool is None:
            continue
        info = pool.info()
        models.append({"model_path": name, "ready": pool.ready, "replicas": len(pool.replicas),
                       "context_length": info.max_context if info else None,
                       "max_running_requests": info.max_rows if info else None,
                       "dtype": info.model_dtype if info else None, "device": info.device if info else None})
    return {"version": "sluice-0.1.0", "served_models": models,
            "model_path": models[0]["model_path"] if models else None}


@get("/health_generate", summary="SGLang: 200 when a one-token generation succeeds, else 503 (cached)",
     tags=["SGLang"],
     opt=PUBLIC, operation_class=documented(None, {200: ("Healthy", None), 503: ("Unhealthy", None)}))
async def health_generate(services: Services) -> Response:
    """Served from the cached probe (`gateway.serving.health_probe`): at most one generation per interval."""
    return Response(b"", status_code=200 if await services.probe.healthy() else 503)


@post("/detokenize", status_code=200, summary="SGLang: token ids -> text", tags=["SGLang"],
      operation_class=documented(DetokenizeBody, {200: ("Text", DetokenizeResponse), **ERRORS}))
async def detokenize(request: Request, services: Services, payload: Any) -> Response:
    body = body_of(payload, DetokenizeBody)
    if not all(t >= 0 for t in body.tokens):
        raise BodyInvalid("tokens must be non-negative token ids", param="tokens")
    try:
        async with tokenizer_call(services, request, body.model) as tokenizer:
            text = await tokenizer.detokenize(body.tokens, body.skip_special_tokens is not False)
    except ValidationFailed as error:
        raise BodyInvalid(error.message, param=error.param) from error
    return Response(text, media_type="application/json")


def router() -> Router:
    return Router(path="/", route_handlers=[get_model_info, get_server_info, health_generate, detokenize],
                  dependencies={"payload": Provide(read_json)}, exception_handlers=SGLANG.exception_handlers())
