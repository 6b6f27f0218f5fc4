"""Tenants take turns at the free rows: the waiting queue in the order admission considers it.

First come, first served let one tenant's 128-prompt request (128 worker requests, each one or more rows) hold
another tenant's one-token request until all of them had started. Here each waiting request is ranked by how
many rows its tenant runs now plus how many rows of the tenant's requests wait before it; among equal ranks
the tenant that started a request least recently goes first, then arrival order. So a tenant with nothing
running is considered first, and tenants that wait together alternate even when each runs nothing. The
gateway names the tenant (`GenerateRequest.tenant`, the billed team's tag); requests without one share "".

Batch requests (`GenerateRequest.priority` "batch", the gateway's batch lines) come after every interactive
one, whatever their ranks: a request's lane is its priority and its tenant, and turns are taken within a lane
(rows running and last turns are counted per lane), so a team's batch rows never rank its interactive requests
behind another team's, and teams' batches take turns among themselves.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable

from worker.engine.sequence import RequestState

_REMEMBERED = 10_000  # tenants whose last turn is kept; beyond, the oldest memories are dropped


def tenant_of(state: RequestState) -> str:
    return state.prepared.request.tenant


def is_batch(state: RequestState) -> bool:
    return state.prepared.request.priority == "batch"


def lane_of(state: RequestState) -> tuple[bool, str]:
    """Whom a request takes turns with: requests of its priority; interactive (False) sorts first."""
    return is_batch(state), tenant_of(state)


class FairTurns:
    def __init__(self) -> None:
        self._clock = itertools.count(1)
        self._last: dict[tuple[bool, str], int] = {}  # lane -> when it last started a request, oldest first

    def order(self, waiting: Iterable[RequestState], running: Counter[tuple[bool, str]]) -> list[RequestState]:
        """`waiting` (in arrival order) in fair turns, given the rows each lane runs now: interactive first."""
        ahead: Counter[tuple[bool, str]] = Counter()
        ranked = []
        for arrival, state in enumerate(waiting):
            lane = lane_of(state)
            ranked.append((lane[0], running[lane] + ahead[lane], self._last.get(lane, 0), arrival, state))
            ahead[lane] += state.rows_wanted
        ranked.sort(key=lambda entry: entry[:4])
        return [entry[4] for entry in ranked]

    def started(self, state: RequestState) -> None:
        tenant = lane_of(state)
        self._last.pop(tenant, None)
        self._last[tenant] = next(self._clock)
        if len(self._last) > _REMEMBERED:
            del self._last[next(iter(self._last))]
