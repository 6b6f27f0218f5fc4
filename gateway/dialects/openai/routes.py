"""OpenAI routes (also Friendli's container paths): `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

`X-API-Dialect: friendli-legacy` forces Friendli's legacy completions stream; the body's legacy-only
keys select it too (see `gateway.dialects.openai.friendli_legacy`).
"""

from __future__ import annotations

from litestar import Request, Router, get, post
from litestar.response import Response, Stream

from common.headers import header
from gateway.dialects.fast_path import DIRECT
from gateway.dialects.openai.chat import ChatBody, OpenAIChat
from gateway.dialects.openai.completions import CompletionBody, OpenAICompletions
from gateway.dialects.openai.friendli_legacy import wants_legacy
from gateway.dialects.openapi import documented
from gateway.endpoints.adapters import SEPARATOR
from gateway.errors import NotFound
from gateway.serving.pipeline import handle_generation
from gateway.serving.services import Services

OPENAI = OpenAICompletions()
OPENAI_LEGACY = OpenAICompletions(legacy_header=True)
CHAT = OpenAIChat()


@post("/v1/completions", status_code=200, summary="OpenAI completions (Friendli fields accepted)",
      operation_class=documented(CompletionBody, closed=True), opt=DIRECT)
async def completions(request: Request, services: Services) -> Response | Stream:
    dialect = OPENAI_LEGACY if wants_legacy(header(request, b"x-api-dialect")) else OPENAI
    return await handle_generation(request, services, dialect, "/v1/completions")


@post("/v1/chat/completions", status_code=200, summary="OpenAI chat completions (Friendli fields accepted)",
      operation_class=documented(ChatBody, closed=True), opt=DIRECT)
async def chat_completions(request: Request, services: Services) -> Response | Stream:
    return await handle_generation(request, services, CHAT, "/v1/chat/completions")


def callable_models(request: Request, services: Services) -> list[dict]:
    """Endpoints the key may call (its allow-list, empty = every one; a private one only in its team; asleep ones
    too), then each one's registered LoRA adapters as "<endpoint>:<adapter>" (what `model` takes)."""
    created = int(services.started_at)
    endpoints = [status.name for status in services.endpoints.callable(request.user)]
    data = [{"id": name, "object": "model", "created": created, "owned_by": "sluice"} for name in endpoints]
    data += [{"id": f"{endpoint}{SEPARATOR}{adapter}", "object": "model", "created": created, "owned_by": "sluice",
              "parent": endpoint} for endpoint in endpoints for adapter in sorted(services.adapters.of(endpoint))]
    return data


@get("/v1/models", summary="List the served models this key may call")
async def models(request: Request, services: Services) -> dict:
    return {"object": "list", "data": callable_models(request, services)}


@get("/v1/models/{model_id:path}", summary="One model this key may call (`client.models.retrieve`)")
async def model(request: Request, services: Services, model_id: str) -> dict:
    """The id may hold `/`, raw or percent-encoded (the path arrives decoded). A model the key may not call is
    as unknown as one that does not exist: 404, so a private endpoint's name is not disclosed to other teams."""
    wanted = model_id.lstrip("/")
    for entry in callable_models(request, services):
        if entry["id"] == wanted:
            return entry
    raise NotFound(f"The model '{wanted}' does not exist or you do not have access to it.", param="model")


def router() -> Router:
    return Router(path="/", route_handlers=[completions, chat_completions, models, model],
                  exception_handlers=OPENAI.exception_handlers())
