"""The admin API of LoRA adapters: `POST /admin/endpoints/{endpoint}/adapters` with `{"name", "source"}`,
`GET` to list, `DELETE .../adapters/{name}`; registering a name again replaces its source. Registrations are kept
in the endpoint store (a restart keeps them); a name the endpoint's spec declares is a 409 (change the spec).
Served by the endpoints' admin routes (gateway/admin/endpoints.py), which own every path under /admin/endpoints.
A source is a PEFT adapter directory (holding adapter_config.json) or an s3:// prefix; the worker reads and checks
the weights on first use."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import msgspec

from common.protocol import AdapterName, AdapterSource
from gateway.endpoints.adapters import SEPARATOR
from gateway.endpoints.spec import ADAPTERS_WORD, check_adapter_source
from gateway.errors import NotFound, ValidationFailed
from gateway.serving.dialect import convert
from gateway.serving.services import Services


class RegisterAdapter(msgspec.Struct, forbid_unknown_fields=True):
    name: AdapterName
    source: AdapterSource


def _endpoint(services: Services, endpoint: str) -> str:
    if endpoint not in services.endpoints.controllers:
        raise NotFound(f"the endpoint {endpoint!r} does not exist", param="endpoint", code="endpoint_not_found")
    return endpoint


def _listing(services: Services, endpoint: str) -> dict:
    return {"data": [{"name": name, "source": source, "model": f"{endpoint}{SEPARATOR}{name}",
                      "origin": services.adapters.origin(endpoint, name)}
                     for name, source in sorted(services.adapters.of(endpoint).items())]}


def adapter_path(rest: str, endpoints: Collection[str]) -> tuple[str, str | None] | None:
    """(endpoint, adapter name or None) when the path after /admin/endpoints is `<endpoint>/adapters` or
    `<endpoint>/adapters/<name>`; None when it is an endpoint's whole name (one stored before names were
    refused a part `adapters`, spec.ADAPTERS_WORD) or neither. Endpoint names hold '/' (hub ids), so the path
    is read from its end."""
    if rest.strip("/") in endpoints:
        return None
    parts = rest.strip("/").split("/")
    for cut in (1, 2):  # ".../adapters" or ".../adapters/<name>"
        if len(parts) > cut and parts[-cut] == ADAPTERS_WORD:
            return "/".join(parts[:-cut]), parts[-1] if cut == 2 else None
    return None


async def register_adapter(services: Services, endpoint: str, payload: Any) -> dict:
    body = convert(payload, RegisterAdapter)
    spec = services.endpoints.controllers[_endpoint(services, endpoint)].spec
    try:
        check_adapter_source(body.source, spec.provisioner)
    except ValueError as error:
        raise ValidationFailed(f"source {error}", param="source") from None
    await services.adapters.add(endpoint, body.name, body.source)
    return {"endpoint": endpoint, "name": body.name, "source": body.source,
            "model": f"{endpoint}{SEPARATOR}{body.name}", "origin": "registered"}


def list_adapters(services: Services, endpoint: str) -> dict:
    return _listing(services, _endpoint(services, endpoint))


async def remove_adapter(services: Services, endpoint: str, name: str) -> dict:
    await services.adapters.remove(_endpoint(services, endpoint), name)
    return {"endpoint": endpoint, "name": name, "deleted": True}
