"""Fixed worker URLs, run by someone else: the replicas are the URLs, never scaled."""

from __future__ import annotations

from gateway.endpoints.provisioners.base import Observation, Provisioner, ReplicaAddress


class StaticProvisioner(Provisioner):
    scalable = False

    def __init__(self, urls: list[str]):
        self.urls = list(urls)

    async def observe(self) -> Observation:
        return Observation([ReplicaAddress(url, url) for url in self.urls])

    async def add(self, count: int, *, target: int | None = None) -> None:
        """Nothing to start: the set is fixed."""

    async def remove(self, replica_id: str) -> None:
        """Nothing to stop: the workers are not ours."""
