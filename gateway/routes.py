"""Public HTTP routes: each maps to a dialect and hands the request to the shared generation flow."""

from __future__ import annotations

import msgspec
from litestar import Request, Response, get, post
from litestar.response import Stream

from gateway.dialects.openai import OpenAICompletions
from gateway.flow import error_response, handle_generation
from gateway.state import AppState

OPENAI = OpenAICompletions()
_json = msgspec.json.Encoder()


@post("/v1/completions", status_code=200, summary="OpenAI completions")
async def completions(request: Request) -> Response | Stream:
    return await handle_generation(request, OPENAI, "/v1/completions")


@get("/v1/models", summary="List served models")
async def models(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    try:
        await state.authenticate(request)
    except Exception as error:  # rendered as an OpenAI error like every other route
        return error_response(OPENAI, error)
    data = [{"id": name, "object": "model", "created": int(state.started_at), "owned_by": "sluice"}
            for name in state.router.pools]
    return Response(_json.encode({"object": "list", "data": data}), media_type="application/json")


@get("/health", summary="200 once every configured model has a ready worker")
async def health(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    missing = state.router.unready_models()
    if missing:
        body = {"status": "unavailable", "reason": f"no ready worker for: {', '.join(missing)}"}
        return Response(_json.encode(body), status_code=503, media_type="application/json")
    return Response(_json.encode({"status": "ok"}), media_type="application/json")


def public_routes() -> list:
    return [completions, models, health]
