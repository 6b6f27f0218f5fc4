"""TGI and DataCrunch routes, plus the `/generate` and `/tokenize` paths TGI shares with SGLang.

`POST|PUT /generate` picks the dialect from the body (dialects.md §8): `inputs` => TGI; any of
`text` / `input_ids` / `input_embeds` / `sampling_params` => SGLang; both or neither => an error in
the envelope of the side the body leans to.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from litestar import Request, Response, get, post, route
from litestar.response import Stream

from gateway import metrics
from gateway.dialects.base import documented
from gateway.dialects.sglang import SGLANG, SGLangOutput, sglang_error
from gateway.dialects.sglang_request import SGLANG_KEYS, BodyInvalid, SGLangBody
from gateway.dialects.tgi import MAX_BEST_OF, MAX_STOP_SEQUENCES, TGI, GenerateBody
from gateway.errors import NotFound, SluiceError, Unavailable, ValidationFailed
from gateway.flow import error_response, handle_generation, read_json
from gateway.routes_sglang import TokenizeBody, TokenizeDoc
from gateway.state import AppState
from common.protocol import TokenSpan

_json = msgspec.json.Encoder()
GENERATE = TGI(100, stream=False)
GENERATE_STREAM = TGI(100, stream=True)
COMPAT = TGI(100, compat=True)
DC_GENERATE = TGI(20, stream=False)
DC_GENERATE_STREAM = TGI(20, stream=True)


# ---- documentation-only shapes (the OpenAPI document; rendering builds plain dicts) ----

FinishName = Literal["length", "eos_token", "stop_sequence"]


class TokenDoc(msgspec.Struct):
    id: int
    text: str
    logprob: float | None
    special: bool


class PrefillDoc(msgspec.Struct):
    id: int
    text: str
    logprob: float | None


class BestOfDoc(msgspec.Struct):
    generated_text: str
    finish_reason: FinishName
    generated_tokens: int
    prefill: list[PrefillDoc]
    tokens: list[TokenDoc]
    seed: int | None = None


class DetailsDoc(msgspec.Struct):
    finish_reason: FinishName
    generated_tokens: int
    prefill: list[PrefillDoc]
    tokens: list[TokenDoc]
    seed: int | None = None
    top_tokens: list[list[TokenDoc]] | None = None
    best_of_sequences: list[BestOfDoc] | None = None


class GenerateDoc(msgspec.Struct):
    generated_text: str
    details: DetailsDoc | None = None


class StreamDetailsDoc(msgspec.Struct):
    finish_reason: FinishName
    generated_tokens: int
    seed: int | None = None


class StreamDoc(msgspec.Struct):
    index: int
    token: TokenDoc
    top_tokens: list[TokenDoc] = []
    generated_text: str | None = None
    details: StreamDetailsDoc | None = None


class ErrorDoc(msgspec.Struct):
    error: str
    error_type: str


class InfoDoc(msgspec.Struct):
    model_id: str
    max_concurrent_requests: int
    max_best_of: int
    max_stop_sequences: int
    max_input_tokens: int
    max_total_tokens: int
    validation_workers: int
    max_client_batch_size: int
    router: str
    version: str
    model_sha: str | None = None
    model_dtype: str | None = None
    model_device_type: str | None = None
    model_pipeline_tag: str | None = None
    sha: str | None = None
    docker_label: str | None = None


ERRORS = {400: ("Invalid JSON", ErrorDoc), 401: ("Missing or invalid API key", ErrorDoc),
          404: ("Unknown model", ErrorDoc), 413: ("Body too large", ErrorDoc),
          422: ("Input validation error", ErrorDoc), 424: ("Generation error", ErrorDoc),
          429: ("Model is overloaded or rate limited", ErrorDoc), 503: ("No ready worker", ErrorDoc)}
class SGLangBodyErrorDoc(msgspec.Struct):
    object: str
    message: str
    type: str
    param: str | None
    code: int


class SGLangErrorDoc(msgspec.Struct):
    error: dict


# /generate and /tokenize answer in the envelope of the dialect the body picked
EITHER = (ErrorDoc, SGLangBodyErrorDoc, SGLangErrorDoc)
SHARED_ERRORS = {status: (description, EITHER) for status, (description, _) in ERRORS.items()}
TGI_DOC = documented(GenerateBody, {200: ("Generated text", GenerateDoc), **ERRORS})
TGI_STREAM_DOC = documented(GenerateBody, {200: ("A stream of tokens (text/event-stream)", None), **ERRORS},
                            stream_item=StreamDoc)
COMPAT_DOC = documented(GenerateBody, {200: ("A one-element array, or a token stream when stream is true",
                                             list[GenerateDoc]), **ERRORS}, stream_item=StreamDoc)
SHARED_DOC = documented((GenerateBody, SGLangBody), {200: ("TGI GenerateResponse or SGLang output",
                                                           (GenerateDoc, SGLangOutput, list[SGLangOutput])),
                                                    **SHARED_ERRORS}, stream_item=StreamDoc)


def with_default_model(state: AppState, payload: Any) -> Any:
    """TGI has no model field; DataCrunch's optional `model` selects one. Unset = the first served model."""
    if isinstance(payload, dict) and payload.get("model") is None and state.router.pools:
        payload["model"] = next(iter(state.router.pools))
    return payload


async def _tgi(request: Request, dialect: TGI, path: str, payload: Any = None) -> Response | Stream:
    state: AppState = request.app.state.sluice
    if payload is None:
        try:
            payload = await read_json(request, state.settings.max_body_bytes)
        except SluiceError as error:
            return error_response(dialect, error)
    return await handle_generation(request, dialect, path, with_default_model(state, payload))


@post("/generate_stream", status_code=200, summary="TGI: stream generated tokens", tags=["TGI"],
      operation_class=TGI_STREAM_DOC)
async def generate_stream(request: Request) -> Response | Stream:
    return await _tgi(request, GENERATE_STREAM, "/generate_stream")


@post("/", status_code=200, summary="TGI compat: generate, or stream when `stream` is true", tags=["TGI"],
      operation_class=COMPAT_DOC)
async def compat_generate(request: Request) -> Response | Stream:
    return await _tgi(request, COMPAT, "/")


@route("/generate", http_method=["POST", "PUT"], status_code=200, tags=["TGI", "SGLang"],
       summary="TGI generate (body with `inputs`) or SGLang generate (`text`/`input_ids`/...)",
       operation_class=SHARED_DOC)
async def generate(request: Request) -> Response | Stream:
    state: AppState = request.app.state.sluice
    try:
        payload = await read_json(request, state.settings.max_body_bytes)
    except SluiceError as error:
        return error_response(GENERATE, error)
    keys = set(payload) if isinstance(payload, dict) else set()
    tgi, sglang = "inputs" in keys, bool(keys & SGLANG_KEYS)
    if tgi and not sglang:
        return await _tgi(request, GENERATE, "/generate", payload)
    if sglang and not tgi:
        return await handle_generation(request, SGLANG, "/generate", with_default_model(state, payload))
    if tgi:
        return error_response(GENERATE, ValidationFailed(
            "the body mixes TGI (`inputs`) and SGLang (`text`/`input_ids`/`input_embeds`/`sampling_params`) fields",
            param="inputs"))
    return sglang_error(BodyInvalid("the body needs `inputs` (TGI) or one of `text`, `input_ids`, `input_embeds`, "
                                   "`sampling_params` (SGLang)", param="text"))


@post("/v1/completions/generate", status_code=200, summary="DataCrunch: generate (TGI dialect with `model`)",
      tags=["DataCrunch"], operation_class=TGI_DOC)
async def datacrunch_generate(request: Request) -> Response | Stream:
    return await _tgi(request, DC_GENERATE, "/v1/completions/generate")


@post("/v1/completions/generate_stream", status_code=200, summary="DataCrunch: stream generated tokens",
      tags=["DataCrunch"], operation_class=TGI_STREAM_DOC)
async def datacrunch_generate_stream(request: Request) -> Response | Stream:
    return await _tgi(request, DC_GENERATE_STREAM, "/v1/completions/generate_stream")


@get("/v1/completions/health", summary="DataCrunch: 200 once every model has a ready worker", tags=["DataCrunch"])
async def datacrunch_health(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    missing = state.router.unready_models()
    if missing:
        body = {"error": f"no ready worker for: {', '.join(missing)}", "error_type": "healthcheck"}
        return Response(_json.encode(body), status_code=503, media_type="application/json")
    return Response(_json.encode({"status": "ok"}), media_type="application/json")


@get("/info", summary="TGI: model and router information", tags=["TGI"],
     operation_class=documented(None, {200: ("Served model info", InfoDoc), 503: ("No ready worker", ErrorDoc)}))
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


@get("/metrics", summary="Prometheus metrics", tags=["TGI"],
     operation_class=documented(None, {200: ("Prometheus text exposition", None)}))
async def prometheus_metrics() -> Response:
    body, content_type = metrics.exposition()
    return Response(body, media_type=content_type)


async def worker_tokenize(state: AppState, model: str, text: str) -> list[TokenSpan]:
    """Tokenize on a ready worker of `model` (the gateway holds no tokenizer)."""
    pool = state.router.pool(model)
    if pool is None:
        raise NotFound(f"the model {model!r} does not exist")
    replicas = pool.candidates()
    if not replicas:
        raise Unavailable(f"model {model!r} has no ready worker; retry shortly")
    response = await replicas[0].client.post("/tokenize", content=_json.encode({"text": text}),
                                             headers={"content-type": "application/json"})
    if response.status_code != 200:
        raise Unavailable(f"the worker could not tokenize ({response.status_code})")
    return msgspec.json.decode(response.content, type=list[TokenSpan])


@post("/tokenize", status_code=200, tags=["TGI", "SGLang"],
      summary="TGI (`inputs` -> [{id,text,start,stop}]) or SGLang (`text` -> token ids) tokenization",
      operation_class=documented((GenerateBody, TokenizeBody),
                                 {200: ("TGI tokens or SGLang token ids", (list[TokenSpan], TokenizeDoc)),
                                  **SHARED_ERRORS}))
async def tokenize(request: Request) -> Response:
    from gateway.routes_sglang import sglang_tokenize

    state: AppState = request.app.state.sluice
    try:
        payload = await read_json(request, state.settings.max_body_bytes)
        if isinstance(payload, dict) and "inputs" not in payload and ("text" in payload or "prompt" in payload):
            return await sglang_tokenize(request, payload)
        await state.authenticate(request)
        parsed = GENERATE.parse(with_default_model(state, payload), "/tokenize")
        spans = await worker_tokenize(state, parsed.model, parsed.requests[0].prompt or "")
    except SluiceError as error:
        return error_response(GENERATE, error)
    return Response(_json.encode(spans), media_type="application/json")


def tgi_routes() -> list:
    return [generate, generate_stream, compat_generate, datacrunch_generate, datacrunch_generate_stream,
            datacrunch_health, info, prometheus_metrics, tokenize]
