"""Which waiting request starts next, when requests may wait for their LoRA adapter to load.

The queue is first come, first served: the first request that can start is the one admitted (or
none, when it does not fit in the free rows: a large request is never overtaken). Only a request
whose adapter is still loading steps aside, so a cold adapter delays its own requests and nobody
else's; its load was started here, in queue order, and the adapters wanted ahead in the queue are
never evicted to make room for those behind.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from worker.engine.sequence import RequestState
from worker.lora.errors import AdapterError
from worker.lora.store import AdapterStore, Key, key_of


def next_admissible(waiting: deque[RequestState], store: AdapterStore, in_use: set[Key],
                    refuse: Callable[[RequestState, AdapterError], None]) -> RequestState | None:
    """The first waiting request with no adapter or a resident one (set on `state.adapter`); requests
    whose adapter failed to load leave the queue through `refuse`."""
    reserved = set(in_use)
    found, refused = None, []
    for state in waiting:
        ref = state.prepared.request.adapter
        if ref is None:
            found = state
            break
        try:
            adapter = store.get(ref, state.submitted, reserved)
        except AdapterError as error:
            refused.append((state, error))
            continue
        if adapter is not None:
            state.adapter, found = adapter, state
            break
        reserved.add(key_of(ref))
    for state, error in refused:
        waiting.remove(state)
        refuse(state, error)
    return found
