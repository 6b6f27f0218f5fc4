"""`GET /health`: 200 once every configured model has a ready worker (orchestrators poll it)."""

from __future__ import annotations

import msgspec
from litestar import Response, get

from auth.middleware import PUBLIC
from gateway.services import Services

_json = msgspec.json.Encoder()


@get("/health", summary="200 once every configured model has a ready worker", opt=PUBLIC)
async def health(services: Services) -> Response:
    missing = services.router.unready_models()
    if missing:
        body = {"status": "unavailable", "reason": f"no ready worker for: {', '.join(missing)}"}
        return Response(_json.encode(body), status_code=503, media_type="application/json")
    return Response(_json.encode({"status": "ok"}), media_type="application/json")
