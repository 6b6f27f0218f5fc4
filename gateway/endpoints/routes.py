"""The endpoints over HTTP: `POST/GET/PATCH/DELETE /admin/endpoints[/{name}]` (admin key) and `GET /v1/endpoints`
(a team key sees the public endpoints and its team's own, with their state). A name is a model name and may
hold `/` (`HuggingFaceTB/SmolLM2-135M-Instruct`): the routes take the rest of the path as the name, whole.
Errors come in the OpenAI envelope (the app's default)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, Router, delete, get, patch, post
from litestar.di import Provide

from auth.middleware import require_admin
from common.json_body import read_json
from gateway.endpoints.errors import InvalidEndpoint
from gateway.endpoints.status import EndpointStatus
from gateway.services import Services

_json = msgspec.json.Encoder()


def _one(status: EndpointStatus, code: int = 200) -> Response:
    return Response(_json.encode(status), status_code=code, media_type="application/json")


def _name(path: str) -> str:
    return path.removeprefix("/")


@post("/", status_code=201, summary="Create an endpoint (kept in the store across restarts)")
async def create_endpoint(services: Services, payload: Any) -> Response:
    return _one(await services.endpoints.create(payload), 201)


@get("/", summary="Every endpoint with its state")
async def list_endpoints(services: Services) -> Response:
    return Response(_json.encode({"object": "list", "data": services.endpoints.list()}), media_type="application/json")


@get("/{name:path}", summary="One endpoint with its state")
async def get_endpoint(services: Services, name: str) -> Response:
    return _one(services.endpoints.get(_name(name)))


@patch("/{name:path}", summary="Change an endpoint's scaling fields; bounds and idle time apply at once")
async def patch_endpoint(services: Services, name: str, payload: Any) -> Response:
    if not isinstance(payload, dict):
        raise InvalidEndpoint("the body must be a JSON object of the fields to change")
    return _one(await services.endpoints.patch(_name(name), payload))


@delete("/{name:path}", status_code=204, summary="Drain an endpoint's replicas and delete it")
async def delete_endpoint(services: Services, name: str) -> None:
    await services.endpoints.delete(_name(name))


@get("/v1/endpoints", summary="The endpoints this key may call, with their state")
async def visible_endpoints(request: Request, services: Services) -> Response:
    """A team sees how each endpoint is doing, not how it is deployed (sources, provisioner settings)."""
    data = [{"id": s.name, "object": "endpoint", "state": s.state, "reason": s.reason, "replicas": s.replicas,
             "waiting": s.waiting, "private": s.spec.private} for s in services.endpoints.visible(request.user)]
    return Response(_json.encode({"object": "list", "data": data}), media_type="application/json")


def admin_endpoints_router() -> Router:
    return Router(path="/admin/endpoints", guards=[require_admin], dependencies={"payload": Provide(read_json)},
                  route_handlers=[create_endpoint, list_endpoints, get_endpoint, patch_endpoint, delete_endpoint])
