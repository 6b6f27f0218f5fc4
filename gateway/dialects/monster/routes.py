"""MonsterAPI route: `POST /v1/generate`."""

from __future__ import annotations

from litestar import Request, Router, post
from litestar.response import Response, Stream

from gateway.dialects.fast_path import DIRECT
from gateway.dialects.monster.dialect import MonsterBody, MonsterGenerate
from gateway.dialects.openapi import documented
from gateway.serving.pipeline import handle_generation
from gateway.serving.services import Services

MONSTER = MonsterGenerate()


@post("/v1/generate", status_code=200, summary="MonsterAPI generate", operation_class=documented(MonsterBody),
      opt=DIRECT)
async def generate(request: Request, services: Services) -> Response | Stream:
    return await handle_generation(request, services, MONSTER, "/v1/generate")


def router() -> Router:
    return Router(path="/", route_handlers=[generate], exception_handlers=MONSTER.exception_handlers())
