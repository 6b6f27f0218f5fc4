"""Which endpoints exist and what their specs are: the config file's entries and the store's rows.

Precedence, decided once at start:
- A name the config file declares belongs to the file. Its spec is the file's entry with the fields
  patched at run time laid over it, so a restart keeps the patches and an edit of any other field in
  the file takes effect. It cannot be deleted through the API (remove it from the file instead).
- Endpoints created through the API live in the store alone.
- A stored API endpoint whose name the file now declares gives way to the file's entry (logged);
  patches stored for a name the file no longer declares are dropped, and so are patches that no longer
  fit the edited entry (a `min_replicas` above the file's new `max_replicas`, say).

`load` runs again whenever another gateway of the fleet changed an endpoint (config_follower.py); such a
reload drops no row (`prune=False`): gateways mid-deploy may read different config files.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import msgspec
import structlog

from gateway.endpoints.errors import EndpointConflict, EndpointNotFound, InvalidEndpoint
from gateway.endpoints.spec import EndpointSpec, service_taken, sharing_service
from gateway.endpoints.store import EndpointStore

log = structlog.get_logger(__name__)


class EndpointRegistry:
    def __init__(self, store: EndpointStore, declared: Iterable[EndpointSpec]):
        self._store = store
        self._declared = {spec.name: spec for spec in declared}
        self._specs: dict[str, EndpointSpec] = {}
        self._overlays: dict[str, dict[str, Any]] = {}  # name -> patched fields of a declared endpoint
        self.unreadable: set[str] = set()  # stored API endpoints this version cannot read (a newer gateway's)

    async def load(self, *, prune: bool = True) -> list[EndpointSpec]:
        specs, overlays, unreadable = dict(self._declared), {}, set()
        for row in await self._store.rows():
            if row.origin == "config" and row.name in self._declared:
                try:
                    specs[row.name] = self._declared[row.name].patched(row.body)
                    overlays[row.name] = row.body
                    continue
                except (ValueError, msgspec.ValidationError) as error:
                    log.warning("endpoint_patch_dropped", endpoint=row.name, reason=str(error))
            elif row.origin == "api" and row.name not in self._declared:
                try:
                    specs[row.name] = msgspec.convert(row.body, EndpointSpec)
                    continue
                except msgspec.ValidationError as error:
                    log.error("endpoint_unreadable", endpoint=row.name, reason=str(error))
                    unreadable.add(row.name)
                    continue  # kept in the store: a later version may read it
            else:
                log.warning("endpoint_row_superseded", endpoint=row.name, origin=row.origin)
            if prune:
                await self._store.remove(row.name)
        self._specs, self._overlays, self.unreadable = specs, overlays, unreadable
        return list(specs.values())

    def get(self, name: str) -> EndpointSpec | None:
        return self._specs.get(name)

    def all(self) -> list[EndpointSpec]:
        return list(self._specs.values())

    def declared(self, name: str) -> bool:
        return name in self._declared

    async def create(self, spec: EndpointSpec) -> EndpointSpec:
        if spec.name in self._specs:
            raise EndpointConflict(f"the endpoint {spec.name!r} exists already; PATCH it or DELETE it first")
        check_service_free(spec, self._specs.values())
        if not await self._store.insert(spec.name, "api", msgspec.to_builtins(spec)):  # another gateway's, just now
            raise EndpointConflict(f"the endpoint {spec.name!r} exists already; PATCH it or DELETE it first")
        # another gateway's create of the same service may have been stored meanwhile: of two such creates, at least
        # one sees the other's row here (each looks after its own insert) and withdraws
        others = []
        for row in await self._store.rows():
            with contextlib.suppress(msgspec.ValidationError, ValueError):
                if row.name != spec.name:
                    others.append(self._declared[row.name] if row.name in self._declared
                                  else msgspec.convert(row.body, EndpointSpec))
        try:
            check_service_free(spec, others)
        except EndpointConflict:
            await self._store.remove(spec.name)
            raise
        self._specs[spec.name] = spec
        return spec

    async def patch(self, name: str, changes: dict[str, Any]) -> EndpointSpec:
        current = self._specs.get(name)
        if current is None:
            raise EndpointNotFound(name)
        try:
            updated = current.patched(changes)
        except (ValueError, msgspec.ValidationError) as error:
            raise InvalidEndpoint(str(error)) from error
        if name in self._declared:
            overlay = {**self._overlays.get(name, {}), **changes}
            await self._store.put(name, "config", overlay)
            self._overlays[name] = overlay
        else:
            await self._store.put(name, "api", msgspec.to_builtins(updated))
        self._specs[name] = updated
        return updated

    def check_deletable(self, name: str) -> None:
        if name not in self._specs:
            raise EndpointNotFound(name)
        if name in self._declared:
            raise EndpointConflict(f"the endpoint {name!r} is declared in the config file; remove it there")

    async def delete(self, name: str) -> None:
        self.check_deletable(name)
        await self._store.remove(name)
        del self._specs[name]


def check_service_free(spec: EndpointSpec, others: Iterable[EndpointSpec]) -> None:
    """One endpoint per ECS service: two would scale it as two owners (or share one lease under two names)."""
    other = sharing_service(spec, others)
    if other is not None:
        raise EndpointConflict(service_taken(spec, other))
