"""The paths TGI and SGLang share: `POST|PUT /generate` and `POST /tokenize`. The body picks the dialect
(dialects.md §8): `inputs` => TGI; any of `text` / `input_ids` / `input_embeds` / `sampling_params` (for
`/tokenize`: `text` or `prompt`) => SGLang; both or neither => an error in the envelope of the side the
body leans to.
"""

from __future__ import annotations

from typing import Any

from litestar import Request, Router, post, route
from litestar.di import Provide
from litestar.response import Response, Stream

from common.json_body import read_json
from common.protocol import TokenSpan
from gateway.dialects.fast_path import DIRECT
from gateway.dialects.openapi import documented
from gateway.dialects.sglang.dialect import SGLANG
from gateway.dialects.sglang.docs import BodyErrorDoc, SGLangOutput, TokenizeDoc
from gateway.dialects.sglang.docs import ErrorDoc as SGLangErrorDoc
from gateway.dialects.sglang.request import SGLANG_KEYS, BodyInvalid, SGLangBody, TokenizeBody
from gateway.dialects.sglang.routes import tokenize_sglang
from gateway.dialects.tgi.docs import ERRORS, GenerateDoc, ProxyErrorDoc, StreamDoc
from gateway.dialects.tgi.docs import ErrorDoc as TGIErrorDoc
from gateway.dialects.tgi.request import GenerateBody
from gateway.dialects.tgi.routes import GENERATE, tokenize_tgi
from gateway.errors import SluiceError, ValidationFailed
from gateway.serving.pipeline import handle_generation
from gateway.serving.services import Services

EITHER_ERROR = (TGIErrorDoc, ProxyErrorDoc, BodyErrorDoc, SGLangErrorDoc)
SHARED_ERRORS = {status: (description, EITHER_ERROR) for status, (description, _) in ERRORS.items()}
GENERATE_DOC = documented((GenerateBody, SGLangBody), {200: ("TGI GenerateResponse or SGLang output",
                                                             (GenerateDoc, SGLangOutput, list[SGLangOutput])),
                                                       **SHARED_ERRORS}, stream_item=StreamDoc)
TOKENIZE_DOC = documented((GenerateBody, TokenizeBody), {200: ("TGI tokens or SGLang token ids",
                                                               (list[TokenSpan], TokenizeDoc)), **SHARED_ERRORS})


@route("/generate", http_method=["POST", "PUT"], status_code=200, tags=["TGI", "SGLang"],
       summary="TGI generate (body with `inputs`) or SGLang generate (`text`/`input_ids`/...)",
       operation_class=GENERATE_DOC, opt=DIRECT)
async def generate(request: Request, services: Services, payload: Any) -> Response | Stream:
    keys = set(payload) if isinstance(payload, dict) else set()
    tgi, sglang = "inputs" in keys, bool(keys & SGLANG_KEYS)
    if tgi and not sglang:
        return await handle_generation(request, services, GENERATE, "/generate", payload)
    if sglang and not tgi:
        return await handle_generation(request, services, SGLANG, "/generate", payload)
    if tgi:
        raise ValidationFailed("the body mixes TGI (`inputs`) and SGLang (`text`/`input_ids`/`input_embeds`/"
                               "`sampling_params`) fields", param="inputs")
    return SGLANG.error_response(BodyInvalid("the body needs `inputs` (TGI) or one of `text`, `input_ids`, "
                                             "`input_embeds`, `sampling_params` (SGLang)", param="text"))


@post("/tokenize", status_code=200, tags=["TGI", "SGLang"],
      summary="TGI (`inputs` -> [{id,text,start,stop}]) or SGLang (`text` -> token ids) tokenization",
      operation_class=TOKENIZE_DOC)
async def tokenize(request: Request, services: Services, payload: Any) -> Response:
    if isinstance(payload, dict) and "inputs" not in payload and ("text" in payload or "prompt" in payload):
        try:
            return Response(await tokenize_sglang(services, request, payload))
        except SluiceError as error:
            return SGLANG.error_response(error)
    return Response(await tokenize_tgi(services, request, payload))


def router() -> Router:
    """Errors before a body picked a side (an undecodable body, authentication) are answered as TGI answers:
    `{"error", "error_type"}`, which SGLang clients read too (SGLang's own 401 is `{"error": "..."}`)."""
    return Router(path="/", route_handlers=[generate, tokenize], dependencies={"payload": Provide(read_json)},
                  exception_handlers=GENERATE.exception_handlers())
