"""The paths TGI and SGLang share: `POST|PUT /generate` and `POST /tokenize`. The body picks the dialect
(dialects.md §8): `inputs` => TGI; any of `text` / `input_ids` / `input_embeds` / `sampling_params` (for
`/tokenize`: `text` or `prompt`) => SGLang; both or neither => an error in the envelope of the side the
body leans to. What fails before a body picked a side (an undecodable body) is answered as TGI answers.
"""

from __future__ import annotations

import msgspec
from litestar import Request, Response, post, route
from litestar.response import Stream

from gateway.dialects.openapi import documented
from gateway.dialects.sglang.dialect import SGLANG
from gateway.dialects.sglang.docs import BodyErrorDoc, SGLangOutput, TokenizeDoc
from gateway.dialects.sglang.docs import ErrorDoc as SGLangErrorDoc
from gateway.dialects.sglang.request import SGLANG_KEYS, BodyInvalid, SGLangBody, TokenizeBody
from gateway.dialects.sglang.routes import generate_sglang, tokenize_sglang
from gateway.dialects.tgi.docs import ERRORS, GenerateDoc, StreamDoc
from gateway.dialects.tgi.docs import ErrorDoc as TGIErrorDoc
from gateway.dialects.tgi.request import GenerateBody
from gateway.dialects.tgi.routes import GENERATE, generate_tgi, tokenize_tgi
from gateway.errors import SluiceError, ValidationFailed
from gateway.generation import error_response, read_json
from gateway.state import AppState
from common.protocol import TokenSpan

_json = msgspec.json.Encoder()
EITHER_ERROR = (TGIErrorDoc, BodyErrorDoc, SGLangErrorDoc)
SHARED_ERRORS = {status: (description, EITHER_ERROR) for status, (description, _) in ERRORS.items()}
GENERATE_DOC = documented((GenerateBody, SGLangBody), {200: ("TGI GenerateResponse or SGLang output",
                                                             (GenerateDoc, SGLangOutput, list[SGLangOutput])),
                                                       **SHARED_ERRORS}, stream_item=StreamDoc)
TOKENIZE_DOC = documented((GenerateBody, TokenizeBody), {200: ("TGI tokens or SGLang token ids",
                                                               (list[TokenSpan], TokenizeDoc)), **SHARED_ERRORS})


@route("/generate", http_method=["POST", "PUT"], status_code=200, tags=["TGI", "SGLang"],
       summary="TGI generate (body with `inputs`) or SGLang generate (`text`/`input_ids`/...)",
       operation_class=GENERATE_DOC)
async def generate(request: Request) -> Response | Stream:
    state: AppState = request.app.state.sluice
    try:
        payload = await read_json(request, state.settings.max_body_bytes)
    except SluiceError as error:
        return error_response(GENERATE, error)
    keys = set(payload) if isinstance(payload, dict) else set()
    tgi, sglang = "inputs" in keys, bool(keys & SGLANG_KEYS)
    if tgi and not sglang:
        return await generate_tgi(request, GENERATE, "/generate", payload)
    if sglang and not tgi:
        return await generate_sglang(request, payload)
    if tgi:
        return error_response(GENERATE, ValidationFailed(
            "the body mixes TGI (`inputs`) and SGLang (`text`/`input_ids`/`input_embeds`/`sampling_params`) fields",
            param="inputs"))
    return error_response(SGLANG, BodyInvalid("the body needs `inputs` (TGI) or one of `text`, `input_ids`, "
                                              "`input_embeds`, `sampling_params` (SGLang)", param="text"))


@post("/tokenize", status_code=200, tags=["TGI", "SGLang"],
      summary="TGI (`inputs` -> [{id,text,start,stop}]) or SGLang (`text` -> token ids) tokenization",
      operation_class=TOKENIZE_DOC)
async def tokenize(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    try:
        payload = await read_json(request, state.settings.max_body_bytes)
    except SluiceError as error:
        return error_response(GENERATE, error)
    if isinstance(payload, dict) and "inputs" not in payload and ("text" in payload or "prompt" in payload):
        return await tokenize_sglang(request, payload)
    return await tokenize_tgi(request, payload)


def routes() -> list:
    return [generate, tokenize]
