"""The one interface every provisioner offers the endpoint controller.

The controller never knows which provisioner it drives. It asks for replicas (`add`), drains a replica
itself before asking for its removal (`remove`), and watches what exists (`observe`): each replica's
id and URL (None while it has no address yet) and the replicas that exited since the last look, with
the last thing they said. Whether a replica is ready is the controller's business (`/load` polling).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReplicaAddress:
    replica_id: str
    url: str | None  # None while the replica has no reachable address yet (an ECS task provisioning)


@dataclass(frozen=True)
class ReplicaExit:
    replica_id: str
    reason: str  # the worker's last line, or the platform's stop reason
    load_failed: bool = False  # the worker said its model cannot load: starting it again cannot help


@dataclass(frozen=True)
class Observation:
    replicas: list[ReplicaAddress] = field(default_factory=list)
    exits: list[ReplicaExit] = field(default_factory=list)


class ProvisionerBackoff(Exception):
    """The platform asked us to slow down (API throttling): nothing was done; try again in `retry_in` s."""

    def __init__(self, message: str, retry_in: float):
        super().__init__(message)
        self.retry_in = retry_in


class FenceLost(Exception):
    """The write was not made: this gateway no longer holds the endpoint's lease (or too little of it is left for
    the write to land inside it). The new owner decides from what the service says."""


class Provisioner(ABC):
    scalable = True  # False: a fixed set of replicas (add and remove do nothing)
    # True: the replicas outlive this gateway and every gateway of the fleet sees them (an ECS service): one
    # gateway at a time scales them (ownership.py), and a stopping gateway leaves them as they are
    shared = False
    observe_interval_s = 0.0  # the least time between two `observe` calls (remote APIs cost a round trip)

    async def open(self) -> None:  # noqa: B027 (an optional hook)
        """Connect, and adopt replicas that already exist (an ECS service that kept running). Called again
        when this gateway takes the endpoint's scaling over from another."""

    @abstractmethod
    async def observe(self) -> Observation: ...

    @abstractmethod
    async def add(self, count: int, *, target: int | None = None) -> None:
        """Start `count` more replicas. `target`, where the provisioner writes a count (ECS): the absolute count
        the service should reach (the controller's decision), so a repeated or late call asks for the same
        count again instead of one more."""

    @abstractmethod
    async def remove(self, replica_id: str) -> None:
        """Stop this replica (the controller drained it first) and lower the replica count by one."""

    async def close(self) -> None:  # noqa: B027 (an optional hook)
        """Let go: stop what this gateway started and owns alone (local processes)."""
