"""Public HTTP routes: each maps to a dialect and hands the request to the shared generation flow."""

from __future__ import annotations

import msgspec
from litestar import Request, Response, get

from gateway.routes_friendli import friendli_routes
from gateway.routes_monster import monster_routes
from gateway.routes_openai import openai_routes
from gateway.routes_sglang import sglang_routes
from gateway.routes_tgi import tgi_routes
from gateway.state import AppState

_json = msgspec.json.Encoder()


@get("/health", summary="200 once every configured model has a ready worker")
async def health(request: Request) -> Response:
    state: AppState = request.app.state.sluice
    missing = state.router.unready_models()
    if missing:
        body = {"status": "unavailable", "reason": f"no ready worker for: {', '.join(missing)}"}
        return Response(_json.encode(body), status_code=503, media_type="application/json")
    return Response(_json.encode({"status": "ok"}), media_type="application/json")


def public_routes() -> list:
    return [*openai_routes(), *friendli_routes(), *monster_routes(), *tgi_routes(), *sglang_routes(), health]
