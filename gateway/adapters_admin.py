"""The admin API of LoRA adapters: `POST /admin/endpoints/{endpoint}/adapters` with `{"name", "source"}`,
`GET` to list, `DELETE .../adapters/{name}`; registering a name again replaces its source. A source is a PEFT
adapter directory (holding adapter_config.json) or an s3:// prefix; the worker reads and checks the weights on
first use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from litestar import Router, delete, get, post
from litestar.di import Provide

from auth.middleware import require_admin
from gateway.adapters import SEPARATOR
from gateway.dialects.base import DEFAULT, convert
from gateway.errors import NotFound, ValidationFailed
from gateway.services import Services
from common.json_body import read_json
from common.protocol import AdapterName, AdapterSource


class RegisterAdapter(msgspec.Struct, forbid_unknown_fields=True):
    name: AdapterName
    source: AdapterSource


def _endpoint(services: Services, endpoint: str) -> str:
    if endpoint not in services.endpoints.controllers:
        raise NotFound(f"the endpoint {endpoint!r} does not exist", param="endpoint", code="endpoint_not_found")
    return endpoint


def _check_source(source: str) -> None:
    if source.startswith("s3://"):
        if len(source) <= len("s3://") or source[len("s3://"):].startswith("/"):
            raise ValidationFailed("source must be s3://<bucket>/<prefix>", param="source")
        return
    if not Path(source).is_absolute() or not (Path(source) / "adapter_config.json").is_file():
        raise ValidationFailed("source must be an absolute path to a PEFT adapter directory (holding "
                               "adapter_config.json) or an s3:// prefix", param="source")


def _listing(services: Services, endpoint: str) -> dict:
    return {"data": [{"name": name, "source": source, "model": f"{endpoint}{SEPARATOR}{name}"}
                     for name, source in sorted(services.adapters.of(endpoint).items())]}


def _split(services: Services, rest: str, with_name: bool) -> tuple[str, str | None]:
    """(endpoint, adapter name) of the path after /admin/endpoints: endpoint names hold '/' (hub ids), so the
    path is read from its end: `<endpoint>/adapters` or `<endpoint>/adapters/<name>`."""
    parts = rest.strip("/").split("/")
    name = parts.pop() if with_name and len(parts) > 2 else None
    if len(parts) < 2 or parts[-1] != "adapters" or (with_name and name is None):
        raise NotFound("no such admin path: use /admin/endpoints/<endpoint>/adapters[/<name>]",
                       code="not_found")
    return _endpoint(services, "/".join(parts[:-1])), name


@post("/{rest:path}", status_code=201)
async def register_adapter(services: Services, payload: Any, rest: str) -> dict:
    endpoint, _ = _split(services, rest, with_name=False)
    body = convert(payload, RegisterAdapter)
    _check_source(body.source)
    services.adapters.add(endpoint, body.name, body.source)
    return {"endpoint": endpoint, "name": body.name, "source": body.source,
            "model": f"{endpoint}{SEPARATOR}{body.name}"}


@get("/{rest:path}")
async def list_adapters(services: Services, rest: str) -> dict:
    endpoint, _ = _split(services, rest, with_name=False)
    return _listing(services, endpoint)


@delete("/{rest:path}", status_code=200)
async def remove_adapter(services: Services, rest: str) -> dict:
    endpoint, name = _split(services, rest, with_name=True)
    services.adapters.remove(endpoint, name)
    return {"endpoint": endpoint, "name": name, "deleted": True}


def adapters_router() -> Router:
    return Router(path="/admin/endpoints", route_handlers=[register_adapter, list_adapters, remove_adapter],
                  guards=[require_admin], dependencies={"payload": Provide(read_json)},
                  exception_handlers=DEFAULT.exception_handlers())
