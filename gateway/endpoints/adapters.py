"""The LoRA adapters registered per endpoint, and which one a request asks for.

An endpoint declares adapters in its spec (`adapters = { <name> = "<source>" }` on its config entry, or in the
body that created it through the API); those change only with the spec. The operator registers more through
the admin API (gateway/admin/adapters.py): those are kept in the endpoint store, so a restart keeps them, and
go with their endpoint when it is deleted. A source is a PEFT adapter directory or an s3:// prefix.
A client only ever names a registered adapter: OpenAI-style bodies as `model: "<endpoint>:<adapter>"`, TGI
as `adapter_id`, SGLang as `lora_path`. The gateway turns the name into an `AdapterRef` (name and source)
for the worker; an unknown name is a 404 in the dialect's envelope.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

import structlog

from common.protocol import AdapterRef
from gateway.endpoints.errors import EndpointConflict
from gateway.endpoints.store import EndpointStore
from gateway.errors import NotFound

log = structlog.get_logger(__name__)
SEPARATOR = ":"  # adapter names never hold one (common.protocol.ADAPTER_NAME_PATTERN)


def split_model(model: str, endpoints) -> tuple[str, str | None]:
    """("<endpoint>", "<adapter>") of an OpenAI model name; the name itself when it is an endpoint."""
    if model in endpoints or SEPARATOR not in model:
        return model, None
    endpoint, adapter = model.rsplit(SEPARATOR, 1)
    return endpoint, adapter


class AdapterRegistry:
    def __init__(self, store: EndpointStore, declared: Callable[[str], dict[str, str]]):
        """`declared(endpoint)`: the adapters the endpoint's spec names (name -> source)."""
        self._store = store
        self._declared = declared
        self._registered: dict[str, dict[str, str]] = {}  # endpoint -> adapter name -> source, through the API

    async def load(self, endpoints: Collection[str]) -> None:
        """The stored registrations of these endpoints. A row of an endpoint that is gone, or of a name its spec
        now declares itself (the spec wins), is dropped, as the registry drops patches of a vanished endpoint."""
        for row in await self._store.adapters():
            if row.endpoint in endpoints and row.name not in self._declared(row.endpoint):
                self._registered.setdefault(row.endpoint, {})[row.name] = row.source
                continue
            log.warning("adapter_registration_dropped", endpoint=row.endpoint, adapter=row.name)
            await self._store.remove_adapter(row.endpoint, row.name)

    def of(self, endpoint: str) -> dict[str, str]:
        return {**self._registered.get(endpoint, {}), **self._declared(endpoint)}

    def origin(self, endpoint: str, name: str) -> str:
        """Where `name` comes from: "declared" (the endpoint's spec) or "registered" (the admin API)."""
        return "declared" if name in self._declared(endpoint) else "registered"

    def ref(self, endpoint: str, name: str, field_name: str) -> AdapterRef:
        adapters = self.of(endpoint)
        if name not in adapters:
            known = ", ".join(sorted(adapters)) or "none are registered"
            raise NotFound(f"the adapter {name!r} is not registered for {endpoint!r} ({known})", param=field_name,
                           code="adapter_not_found")
        return AdapterRef(name=name, source=adapters[name])

    async def add(self, endpoint: str, name: str, source: str) -> None:
        """Registers `name`, or gives it a new source."""
        self._check_not_declared(endpoint, name)
        await self._store.put_adapter(endpoint, name, source)
        self._registered.setdefault(endpoint, {})[name] = source

    async def remove(self, endpoint: str, name: str) -> None:
        self.ref(endpoint, name, "name")
        self._check_not_declared(endpoint, name)
        await self._store.remove_adapter(endpoint, name)
        del self._registered[endpoint][name]

    async def forget(self, endpoint: str) -> None:
        """The endpoint is deleted: its registrations go with it (one of the same name later starts with none)."""
        await self._store.remove_adapters(endpoint)
        self._registered.pop(endpoint, None)

    def _check_not_declared(self, endpoint: str, name: str) -> None:
        if name in self._declared(endpoint):
            raise EndpointConflict(f"the adapter {name!r} is declared in the spec of {endpoint!r} (its config entry "
                                   "or creating body); change it there", param="name", code="adapter_declared")
