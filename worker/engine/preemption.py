"""Preemption for fairness: a tenant with nothing running may take a row from the most-served tenant.

Fair turns (fair_turns.py) decide who starts when a row frees; with every row held by one tenant's long
requests, another tenant's one-token request still waited for one of them to finish. So when the request
at the head of the queue (in fair turns) belongs to a tenant that runs no rows and does not fit, the
scheduler parks the newest one-row requests of the tenant running the most rows until it fits. A parked
request keeps its row whole (its sequence, decoding state and cache positions: slots.py `Parked`), goes
back to the front of the queue and resumes exactly where it stopped when fair turns give it a row again:
its tokens are those it would have produced unparked. Rules that keep it from thrashing or piling up:
- only a tenant running nothing preempts, and only when the head cannot start otherwise;
- a victim's tenant keeps at least as many rows as the newcomer takes, so the newcomer's tenant is never
  the one that runs the most, and the parked request's tenant (still running rows) cannot preempt back;
- only ordinary one-row requests are parked (not beams, not `n` / `best_of` > 1, whose rows move together);
- at most `max_rows` rows are parked at once: their cache positions are held in memory meanwhile.
"""

from __future__ import annotations

from collections import Counter

from worker.engine.fair_turns import tenant_of
from worker.engine.sequence import RequestState, Sequence


def choose_victims(head: RequestState, rows: list[Sequence], max_rows: int, parked_rows: int) -> list[RequestState]:
    """The requests to park (newest first) so that `head` fits beside `rows`, or [] when it fits already or
    the rules above forbid it."""
    need = len(rows) + head.prepared.candidates - max_rows
    running = Counter(tenant_of(row.request) for row in rows)
    if need <= 0 or running[tenant_of(head)] or parked_rows + need > max_rows:
        return []
    movable: dict[str, list[RequestState]] = {}
    for row in rows:
        state = row.request
        if state.prepared.candidates == 1 and state.beam is None and not (state.done or row.finish):
            movable.setdefault(tenant_of(state), []).append(state)
    for states in movable.values():
        states.sort(key=lambda state: state.admitted)
    victims: list[RequestState] = []
    while len(victims) < need:
        tenants = [t for t, states in movable.items() if states and running[t] - 1 >= head.prepared.candidates]
        if not tenants:
            return []
        tenant = max(tenants, key=lambda t: running[t])
        victims.append(movable[tenant].pop())
        running[tenant] -= 1
    return victims
