"""FriendliAI routes: `/serverless/v1/...` (model = model code) and `/dedicated/v1/...` (model = endpoint id,
served when it names a served model, 404 otherwise). The container paths are the OpenAI routes.
"""

from __future__ import annotations

from litestar import Request, Router, post
from litestar.response import Response, Stream

from common.headers import header
from gateway.dialects.fast_path import DIRECT
from gateway.dialects.openai.chat import ChatBody, OpenAIChat
from gateway.dialects.openai.completions import CompletionBody, OpenAICompletions
from gateway.dialects.openai.friendli_legacy import wants_legacy
from gateway.dialects.openapi import documented
from gateway.serving.pipeline import handle_generation
from gateway.serving.services import Services

COMPLETIONS = OpenAICompletions(friendli=True)
COMPLETIONS_LEGACY = OpenAICompletions(friendli=True, legacy_header=True)
CHAT = OpenAIChat(friendli=True)


def _completions(path: str):
    @post(path, status_code=200, summary="Friendli completions", operation_class=documented(CompletionBody),
          name=f"friendli-completions-{path.split('/')[1]}", opt=DIRECT)
    async def handler(request: Request, services: Services) -> Response | Stream:
        dialect = COMPLETIONS_LEGACY if wants_legacy(header(request, b"x-api-dialect")) else COMPLETIONS
        return await handle_generation(request, services, dialect, path)

    return handler


def _chat(path: str):
    @post(path, status_code=200, summary="Friendli chat completions", operation_class=documented(ChatBody),
          name=f"friendli-chat-{path.split('/')[1]}", opt=DIRECT)
    async def handler(request: Request, services: Services) -> Response | Stream:
        return await handle_generation(request, services, CHAT, path)

    return handler


def router() -> Router:
    return Router(path="/", route_handlers=[
        _completions("/serverless/v1/completions"), _chat("/serverless/v1/chat/completions"),
        _completions("/dedicated/v1/completions"), _chat("/dedicated/v1/chat/completions")],
        exception_handlers=COMPLETIONS.exception_handlers())
