"""MonsterAPI route: `POST /v1/generate`."""

from __future__ import annotations

from litestar import Request, Response, post
from litestar.response import Stream

from gateway.dialects.monster.dialect import MonsterBody, MonsterGenerate
from gateway.dialects.openapi import documented
from gateway.generation import handle_generation

MONSTER = MonsterGenerate()


@post("/v1/generate", status_code=200, summary="MonsterAPI generate", operation_class=documented(MonsterBody))
async def generate(request: Request) -> Response | Stream:
    return await handle_generation(request, MONSTER, "/v1/generate")


def routes() -> list:
    return [generate]
