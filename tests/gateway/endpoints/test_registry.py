"""The endpoint registry over a real SQLite file and a real PostgreSQL database: run-time changes
survive a restart, and config entries and stored rows combine as registry.py documents."""

from __future__ import annotations

import pytest

from gateway.endpoints.errors import EndpointConflict, EndpointNotFound, InvalidEndpoint
from gateway.endpoints.registry import EndpointRegistry
from gateway.endpoints.spec import parse_endpoint
from gateway.endpoints.store import EndpointStore

SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct"


async def opened(url: str, declared=()) -> EndpointRegistry:
    registry = EndpointRegistry(await EndpointStore.open(url), declared)
    await registry.load()
    return registry


async def closed(registry: EndpointRegistry) -> None:
    await registry._store.close()


async def test_created_patched_and_deleted_endpoints_survive_a_restart(store_url):
    registry = await opened(store_url)
    await registry.create(parse_endpoint({"name": "org/model-a", "min_replicas": 0, "source": "/m/a"}))
    await registry.create(parse_endpoint({"name": "org/model-b",
                                          "provisioner": {"kind": "static", "urls": ["http://w:8100"]}}))
    await registry.patch("org/model-a", {"max_replicas": 4, "idle_seconds": 12})
    await registry.delete("org/model-b")
    await closed(registry)

    again = await opened(store_url)
    assert [s.name for s in again.all()] == ["org/model-a"]
    spec = again.get("org/model-a")
    assert (spec.min_replicas, spec.max_replicas, spec.idle_seconds, spec.source) == (0, 4, 12, "/m/a")
    await closed(again)


async def test_a_declared_endpoint_keeps_its_patches_and_takes_the_files_other_edits(store_url):
    declared = [parse_endpoint({"name": SMOL, "min_replicas": 1, "max_replicas": 2, "max_batch_size": 8})]
    registry = await opened(store_url, declared)
    await registry.patch(SMOL, {"min_replicas": 0})
    await registry.patch(SMOL, {"idle_seconds": 30})
    await closed(registry)

    edited = [parse_endpoint({"name": SMOL, "min_replicas": 1, "max_replicas": 2, "max_batch_size": 16})]
    again = await opened(store_url, edited)
    spec = again.get(SMOL)
    assert (spec.min_replicas, spec.idle_seconds, spec.max_batch_size) == (0, 30, 16)
    await closed(again)


async def test_a_patch_that_no_longer_fits_the_edited_file_is_dropped(store_url):
    registry = await opened(store_url, [parse_endpoint({"name": SMOL, "max_replicas": 4})])
    await registry.patch(SMOL, {"min_replicas": 3})
    await closed(registry)

    again = await opened(store_url, [parse_endpoint({"name": SMOL, "max_replicas": 2})])
    assert (again.get(SMOL).min_replicas, again.get(SMOL).max_replicas) == (1, 2)
    await closed(again)
    third = await opened(store_url, [parse_endpoint({"name": SMOL, "max_replicas": 4})])
    assert third.get(SMOL).min_replicas == 1  # the dropped patch is gone from the store too
    await closed(third)


async def test_the_file_wins_over_a_stored_endpoint_of_the_same_name(store_url):
    registry = await opened(store_url)
    await registry.create(parse_endpoint({"name": SMOL, "min_replicas": 0, "source": "/api/made"}))
    await closed(registry)

    again = await opened(store_url, [parse_endpoint({"name": SMOL, "source": "/from/file"})])
    assert again.get(SMOL).source == "/from/file" and again.get(SMOL).min_replicas == 1
    await closed(again)


async def test_patches_of_an_endpoint_the_file_no_longer_declares_are_dropped(store_url):
    registry = await opened(store_url, [parse_endpoint({"name": SMOL})])
    await registry.patch(SMOL, {"idle_seconds": 5})
    await closed(registry)
    again = await opened(store_url)
    assert again.all() == []
    await closed(again)


async def test_refusals(store_url):
    registry = await opened(store_url, [parse_endpoint({"name": SMOL})])
    with pytest.raises(EndpointConflict, match="exists already"):
        await registry.create(parse_endpoint({"name": SMOL}))
    with pytest.raises(EndpointConflict, match="declared in the config file"):
        await registry.delete(SMOL)
    with pytest.raises(EndpointNotFound):
        await registry.patch("org/absent", {"min_replicas": 0})
    with pytest.raises(EndpointNotFound):
        await registry.delete("org/absent")
    with pytest.raises(InvalidEndpoint, match="`source` cannot change"):
        await registry.patch(SMOL, {"source": "/elsewhere"})
    with pytest.raises(InvalidEndpoint, match="must not exceed"):
        await registry.patch(SMOL, {"min_replicas": 2})
    with pytest.raises(InvalidEndpoint, match=r"\$.min_replicas"):
        await registry.patch(SMOL, {"min_replicas": "two"})
    assert registry.get(SMOL).min_replicas == 1  # nothing half-applied
    await closed(registry)
