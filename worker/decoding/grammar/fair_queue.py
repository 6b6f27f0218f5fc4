"""Compile jobs shared fairly among tenants: one FIFO per tenant, served round robin, with a cap on what
each tenant may have running and waiting.

A compile cannot be stopped once xgrammar runs it, so a tenant that sends heavy distinct schemas would
otherwise hold every compile thread. Capped at `per_tenant` running jobs (the threads less one), it
always leaves a thread to the others. The tenant "" (a request that names none) is not capped.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from typing import Generic, TypeVar

Job = TypeVar("Job")


class TenantQueueFull(Exception):
    pass


class FairQueue(Generic[Job]):
    """Not thread-safe: the caller holds its own lock around every call."""

    def __init__(self, per_tenant: int, waiting_per_tenant: int):
        self.per_tenant, self.waiting_per_tenant = per_tenant, waiting_per_tenant
        self._waiting: OrderedDict[str, deque[Job]] = OrderedDict()  # tenants with waiting jobs, next first
        self._running: Counter[str] = Counter()

    def put(self, tenant: str, job: Job) -> None:
        waiting = self._waiting.get(tenant, ())
        if tenant and len(waiting) >= self.waiting_per_tenant:
            raise TenantQueueFull(f"{len(waiting)} compiles of this tenant are already waiting")
        self._waiting.setdefault(tenant, deque()).append(job)

    def take(self) -> tuple[str, Job] | None:
        """The next job to run, from the first tenant in turn that may run one more; it goes last."""
        for tenant, waiting in self._waiting.items():
            if tenant and self._running[tenant] >= self.per_tenant:
                continue
            job = waiting.popleft()
            if waiting:
                self._waiting.move_to_end(tenant)
            else:
                del self._waiting[tenant]
            self._running[tenant] += 1
            return tenant, job
        return None

    def done(self, tenant: str) -> None:
        self._running[tenant] -= 1
        if not self._running[tenant]:
            del self._running[tenant]

    def backlog(self, tenant: str) -> tuple[int, int]:
        """(running, waiting) jobs of this tenant."""
        return self._running[tenant], len(self._waiting.get(tenant, ()))

    def clear(self) -> list[Job]:
        """Drop every waiting job (shutdown); the running ones are the caller's."""
        dropped = [job for waiting in self._waiting.values() for job in waiting]
        self._waiting.clear()
        return dropped
