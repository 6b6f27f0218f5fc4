"""Tenants take turns at the free rows: the waiting queue in the order admission considers it.

First come, first served let one tenant's 128-prompt request (128 worker requests, each one or more rows) hold
another tenant's one-token request until all of them had started. Here each waiting request is ranked by how
many rows its tenant runs now plus how many rows of the tenant's requests wait before it; among equal ranks
the tenant that started a request least recently goes first, then arrival order. So a tenant with nothing
running is considered first, and tenants that wait together alternate even when each runs nothing. The
gateway names the tenant (`GenerateRequest.tenant`, the billed team's tag); requests without one share "".
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable

from worker.engine.sequence import RequestState

_REMEMBERED = 10_000  # tenants whose last turn is kept; beyond, the oldest memories are dropped


def tenant_of(state: RequestState) -> str:
    return state.prepared.request.tenant


class FairTurns:
    def __init__(self) -> None:
        self._clock = itertools.count(1)
        self._last: dict[str, int] = {}  # tenant -> when it last started a request, oldest first

    def order(self, waiting: Iterable[RequestState], running: Counter[str]) -> list[RequestState]:
        """`waiting` (in arrival order) in fair turns, given the rows each tenant runs now."""
        ahead: Counter[str] = Counter()
        ranked = []
        for arrival, state in enumerate(waiting):
            tenant = tenant_of(state)
            ranked.append((running[tenant] + ahead[tenant], self._last.get(tenant, 0), arrival, state))
            ahead[tenant] += state.rows_wanted
        ranked.sort(key=lambda entry: entry[:3])
        return [entry[3] for entry in ranked]

    def started(self, state: RequestState) -> None:
        tenant = tenant_of(state)
        self._last.pop(tenant, None)
        self._last[tenant] = next(self._clock)
        if len(self._last) > _REMEMBERED:
            del self._last[next(iter(self._last))]
