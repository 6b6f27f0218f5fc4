"""Preemption for fairness: a tenant with nothing running may take rows from the most-served tenant.

Fair turns (fair_turns.py) decide who starts when a row frees; with every row held by one tenant's long
requests (many one-row requests, or one request of `n` = 32 rows), another tenant's one-token request still
waited for them to finish. So when the request at the head of the queue (in fair turns) belongs to a tenant
that runs no rows and does not fit, the scheduler parks rows of the tenant running the most rows until it
fits. What is parked, a unit at a time:
- a row of a request whose rows are independent (one row, or `n` / `best_of` candidates: each its own seed,
  history and cache): the newest request's last running candidate first, so a 32-row request gives up only
  the rows the newcomer needs and keeps decoding the others;
- a beam search whole: its beams share one search (scores, finished set, parents), so they stop together.
A parked row keeps itself whole (its sequence, decoding state and cache positions: slots.py `Parked`); its
request waits at the front of the queue for as many rows as it has parked and resumes them exactly where they
stopped when fair turns give it rows again: its tokens are those it would have produced unparked. The newcomer's
first token comes from a decode step of its rows alone (scheduler.py): the rows left running sit that step out.
Rules that keep it from thrashing or piling up:
- only a tenant running nothing preempts, and only when the head cannot start otherwise;
- a victim's tenant keeps at least as many rows as the newcomer takes, so the newcomer's tenant is never the
  one that runs the most and the victim's tenant (still running rows) cannot preempt back; a beam search
  wider than the newcomer may be parked even when its tenant keeps fewer (none, when it was all it ran):
  resuming it needs more rows than the newcomer's tenant holds, so it cannot take them back (it waits its
  turn, and while it waits at the head the rows it left stay free for it);
- at most `max_rows` rows are parked at once: their cache positions are held in memory meanwhile.

Priorities (fair_turns.py lanes): for an interactive request that does not fit, batch rows (any tenant's) are
parked first, newest first, and never the other way round: a batch request parks only batch rows. The rules
above hold within a lane: a tenant "runs nothing" when it runs no rows of the request's priority.
"""

from __future__ import annotations

from collections import Counter

from worker.engine.fair_turns import is_batch, lane_of
from worker.engine.sequence import RequestState, Sequence


def choose_victims(head: RequestState, rows: list[Sequence], max_rows: int, parked_rows: int) -> list[Sequence]:
    """The rows to park (newest first) so that `head` fits beside `rows`, or [] when it fits already or the
    rules above forbid it."""
    wanted = head.rows_wanted
    need = len(rows) + wanted - max_rows
    if need <= 0:
        return []
    units = parkable_units(rows)
    victims: list[Sequence] = []
    if not is_batch(head):  # batch rows give way to an interactive request first, the newest first
        batch = sorted((unit for lane, queue in units.items() if lane[0] for unit in queue),
                       key=lambda unit: unit[0].request.admitted)
        while batch and len(victims) < need:
            victims += batch.pop()
        units = {lane: queue for lane, queue in units.items() if not lane[0]}
    parked = {id(row) for row in victims}
    running = Counter(lane_of(row.request) for row in rows if id(row) not in parked)
    if len(victims) < need and running[lane_of(head)]:
        return []
    units = {lane: queue for lane, queue in units.items() if lane[0] == is_batch(head)}
    while len(victims) < need:
        tenants = [t for t, queue in units.items() if queue and may_give(running[t], len(queue[-1]), wanted)]
        if not tenants:
            return []
        tenant = max(tenants, key=lambda t: running[t])
        unit = units[tenant].pop()
        victims += unit
        running[tenant] -= len(unit)
    return victims if parked_rows + len(victims) <= max_rows else []


def parkable_units(rows: list[Sequence]) -> dict[tuple[bool, str], list[list[Sequence]]]:
    """Per lane, what may be parked at once, oldest first: each running row of a request of independent
    rows (by admission, then candidate), each beam search whole."""
    units: dict[tuple[bool, str], list[tuple[tuple[int, int], list[Sequence]]]] = {}
    beams: dict[int, list[Sequence]] = {}
    for row in rows:
        state = row.request
        if state.done or row.finish:
            continue
        if state.beam is None:
            units.setdefault(lane_of(state), []).append(((state.admitted, row.candidate), [row]))
        elif id(state) not in beams:
            beams[id(state)] = [r for r in rows if r.request is state]
            units.setdefault(lane_of(state), []).append(((state.admitted, 0), beams[id(state)]))
    return {tenant: [unit for _, unit in sorted(queue, key=lambda entry: entry[0])] for tenant, queue in units.items()}


def may_give(running: int, unit: int, wanted: int) -> bool:
    """Whether a tenant running `running` rows may give up `unit` of them to a newcomer taking `wanted`."""
    return running - unit >= wanted or unit > wanted
