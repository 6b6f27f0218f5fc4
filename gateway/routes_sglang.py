"""SGLang helper routes: model/server info, a generation health check, tokenize and detokenize.

`/generate` itself lives in `routes_tgi` (the path is shared and the body picks the dialect).
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, get, post

from gateway.dialects.base import check, convert, documented
from gateway.dialects.sglang import SGLANG
from gateway.dialects.sglang_request import BodyInvalid, SGLangBody
from gateway.errors import NotFound, SluiceError, Unavailable, ValidationFailed
from gateway.flow import error_response, read_json
from gateway.proxy import stream_events
from gateway.state import AppState
from common.protocol import (
    DetokenizeResponse,
    Done,
    Error,
    GenerateRequest,
    SamplingParams,
)

_json = msgspec.json.Encoder()


class ModelInfoDoc(msgspec.Struct):
    model_path: str
    tokenizer_path: str
    is_generation: bool
    preferred_sampling_params: dict | None
    weight_version: str


class TokenizeBody(msgspec.Struct, kw_only=True):
    text: str | list[str] | None = None
    prompt: str | list[str] | None = None
    add_special_tokens: bool | None = None
    model: str | None = None


class TokenizeDoc(msgspec.Struct):
    tokens: list  # ids, or a list of id lists for a list of texts
    count: int | list[int]
    max_model_len: int


class DetokenizeBody(msgspec.Struct, kw_only=True):
    tokens: list[int]
    skip_special_tokens: bool | None = None
    model: str | None = None


class ErrorDoc(msgspec.Struct):
    error: dict


class BodyErrorDoc(msgspec.Struct):
    object: str
    message: str
    type: str
    param: str | None
    code: int


ERRORS = {400: ("Bad request", (ErrorDoc, BodyErrorDoc)), 401: ("Missing or invalid API key", ErrorDoc),
          404: ("Unknown model", ErrorDoc), 413: ("Body too large", ErrorDoc), 503: ("No ready worker", ErrorDoc)}


def _json_response(body: Any, status: int = 200) -> Response:
    return Response(_json.encode(body), status_code=status, media_type="application/json")


def _first_model(state: AppState, name: str | None = None):
    name = name or next(iter(state.router.pools), None)
    pool = state.router.pool(name) if name else None
    if pool is None:
        raise NotFound(f"the model {name!r} does not exist")
    replicas = pool.candidates()
    if not replicas:
        raise Unavailable(f"model {name!r} has no ready worker; retry shortly")
    return pool, replicas[0]


@get("/get_model_info", summary="SGLang: the served model", tags=["SGLang"],
     operation_class=documented(None, {200: ("Model info", ModelInfoDoc), 503: ("No ready worker", ErrorDoc)}))
async def get_model_info(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    try:
        pool, _ = _first_model(state)
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
        pool, _ = _first_model(state)
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


async def sglang_tokenize(request: Request, payload: Any) -> Response:
    """`POST /tokenize` with `text` (or `prompt`): SGLang's `{tokens, count, max_model_len}`."""
    state: AppState = request.app.state.sluice
    from gateway.routes_tgi import worker_tokenize

    try:
        await state.authenticate(request)
        try:
            body = convert(payload, TokenizeBody)
            text = body.text if body.text is not None else body.prompt
            check(text is not None and text != [], "`text` is required", "text")
        except ValidationFailed as error:
            raise BodyInvalid(error.message, param=error.param) from error
        pool, _ = _first_model(state, body.model)
        texts = [text] if isinstance(text, str) else text
        tokens = [[span.id for span in await worker_tokenize(state, pool.name, t)] for t in texts]
        info = pool.info()
    except SluiceError as error:
        return error_response(SGLANG, error)
    single = isinstance(text, str)
    return _json_response({"tokens": tokens[0] if single else tokens,
                           "count": len(tokens[0]) if single else [len(t) for t in tokens],
                           "max_model_len": info.max_context if info else 0})


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
        except ValidationFailed as error:
            raise BodyInvalid(error.message, param=error.param) from error
        _, replica = _first_model(state, body.model)
        sent = {"tokens": body.tokens, "skip_special_tokens": body.skip_special_tokens is not False}
        response = await replica.client.post("/detokenize", content=_json.encode(sent),
                                             headers={"content-type": "application/json"})
        if response.status_code != 200:
            raise BodyInvalid(msgspec.json.decode(response.content, type=Error).message, param="tokens")
    except SluiceError as error:
        return error_response(SGLANG, error)
    return Response(response.content, media_type="application/json")


def sglang_routes() -> list:
    return [get_model_info, get_server_info, health_generate, detokenize]


__all__ = ["SGLangBody", "sglang_routes", "sglang_tokenize"]
