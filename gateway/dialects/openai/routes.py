"""OpenAI routes (also Friendli's container paths): `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

`X-API-Dialect: friendli-legacy` forces Friendli's legacy completions stream; the body's legacy-only
keys select it too (see `gateway.dialects.friendli.legacy`).
"""

from __future__ import annotations

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Stream

from gateway.dialects.friendli.legacy import wants_legacy
from gateway.dialects.openai.chat import ChatBody, OpenAIChat
from gateway.dialects.openai.completions import CompletionBody, OpenAICompletions
from gateway.dialects.openapi import documented
from gateway.errors import SluiceError
from gateway.generation import error_response, handle_generation
from gateway.state import AppState

OPENAI = OpenAICompletions()
OPENAI_LEGACY = OpenAICompletions(legacy_header=True)
CHAT = OpenAIChat()
_json = msgspec.json.Encoder()


@post("/v1/completions", status_code=200, summary="OpenAI completions (Friendli fields accepted)",
      operation_class=documented(CompletionBody))
async def completions(request: Request) -> Response | Stream:
    legacy = wants_legacy(request.headers.get("x-api-dialect"))
    return await handle_generation(request, OPENAI_LEGACY if legacy else OPENAI, "/v1/completions")


@post("/v1/chat/completions", status_code=200, summary="OpenAI chat completions (Friendli fields accepted)",
      operation_class=documented(ChatBody))
async def chat_completions(request: Request) -> Response | Stream:
    return await handle_generation(request, CHAT, "/v1/chat/completions")


@get("/v1/models", summary="List served models")
async def models(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    try:
        await state.authenticate(request)
    except SluiceError as error:  # rendered as an OpenAI error like every other route
        return error_response(OPENAI, error)
    data = [{"id": name, "object": "model", "created": int(state.started_at), "owned_by": "sluice"}
            for name in state.router.pools]
    return Response(_json.encode({"object": "list", "data": data}), media_type="application/json")


def routes() -> list:
    return [completions, chat_completions, models]
