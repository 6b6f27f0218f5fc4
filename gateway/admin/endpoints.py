"""The endpoints over HTTP: `POST/GET/PATCH/DELETE /admin/endpoints[/{name}]` (admin key), their LoRA adapters
under `/admin/endpoints/{name}/adapters` (gateway/admin/adapters.py), and `GET /v1/endpoints`
(a team key sees the public endpoints and its team's own, with their state). A name is a model name and may
hold `/` (`HuggingFaceTB/SmolLM2-135M-Instruct`): the routes take the rest of the path as the name, whole.
Errors come in the OpenAI envelope (the app's default)."""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, Router, delete, get, patch, post
from litestar.di import Provide

from common.json_body import read_json
from gateway.admin.adapters import adapter_path, list_adapters, register_adapter, remove_adapter
from gateway.authentication.middleware import require_admin
from gateway.endpoints.errors import InvalidEndpoint
from gateway.endpoints.status import EndpointStatus
from gateway.errors import NotFound
from gateway.serving.services import Services

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


def _adapters(services: Services, name: str) -> tuple[str, str | None] | None:
    """(endpoint, adapter name or None) when the path names an endpoint's adapters, not an endpoint."""
    return adapter_path(name, services.endpoints.controllers)


@post("/{name:path}", status_code=201, summary="Register a LoRA adapter: /admin/endpoints/{endpoint}/adapters")
async def create_adapter(services: Services, name: str, payload: Any) -> Response:
    target = _adapters(services, name)
    if target is None or target[1] is not None:
        raise NotFound("no such admin path: use /admin/endpoints/<endpoint>/adapters[/<name>]", code="not_found")
    return Response(_json.encode(await register_adapter(services, target[0], payload)), status_code=201,
                    media_type="application/json")


@get("/{name:path}", summary="One endpoint with its state, or its LoRA adapters (.../adapters)")
async def get_endpoint(services: Services, name: str) -> Response:
    target = _adapters(services, name)
    if target is not None and target[1] is None:
        return Response(_json.encode(list_adapters(services, target[0])), media_type="application/json")
    return _one(services.endpoints.get(_name(name)))


@patch("/{name:path}", summary="Change an endpoint's scaling fields; bounds and idle time apply at once")
async def patch_endpoint(services: Services, name: str, payload: Any) -> Response:
    if not isinstance(payload, dict):
        raise InvalidEndpoint("the body must be a JSON object of the fields to change")
    return _one(await services.endpoints.patch(_name(name), payload))


# the status comes with each answer: 204 for a deleted endpoint, 200 and a body for a removed adapter
@delete("/{name:path}", status_code=200, summary="Delete an endpoint (204, after draining), or remove an adapter")
async def delete_endpoint(services: Services, name: str) -> Response:
    target = _adapters(services, name)
    if target is not None and target[1] is not None:
        return Response(_json.encode(await remove_adapter(services, *target)), media_type="application/json")
    await services.endpoints.delete(_name(name))
    return Response(b"", status_code=204)


@get("/v1/endpoints", summary="The endpoints this key may call, with their state")
async def visible_endpoints(request: Request, services: Services) -> Response:
    """A team sees how each endpoint is doing, not how it is deployed (sources, provisioner settings): a failure
    as its fixed phrase, never its detail."""
    data = [{"id": s.name, "object": "endpoint", "state": s.state, "reason": s.reason, "replicas": s.replicas,
             "waiting": s.waiting, "private": s.spec.private} for s in services.endpoints.visible(request.user)]
    return Response(_json.encode({"object": "list", "data": data}), media_type="application/json")


def admin_endpoints_router() -> Router:
    return Router(path="/admin/endpoints", guards=[require_admin], dependencies={"payload": Provide(read_json)},
                  route_handlers=[create_endpoint, create_adapter, list_endpoints, get_endpoint, patch_endpoint,
                                  delete_endpoint])
