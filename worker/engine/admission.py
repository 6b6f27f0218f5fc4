"""Which waiting request starts next, when requests may wait for their LoRA adapter.

The queue is first come, first served: the first request that can start is the one admitted (or
none, when it does not fit in the free rows: a large request is never overtaken). Two kinds of
request step aside without holding up the others:
- one whose adapter is loading (the load starts here, in queue order): a cold adapter delays its
  own requests and nobody else's;
- one whose adapter finds every slot of the LRU held by adapters that running rows use. It waits
  for those rows to finish; until then only base-model requests behind it may start, since an
  adapter request behind it would hold a slot longer and could starve it.
Adapters wanted ahead in the queue are never evicted to make room for those behind.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from worker.engine.sequence import RequestState
from worker.lora.errors import AdapterError
from worker.lora.store import AdapterStore, Key, key_of


def next_admissible(waiting: deque[RequestState], store: AdapterStore, in_use: set[Key],
                    refuse: Callable[[RequestState, AdapterError], None]) -> RequestState | None:
    """The first waiting request that can start (its resident adapter set on `state.adapter`);
    requests whose adapter failed to load leave the queue through `refuse`."""
    reserved = set(in_use)
    found, refused, no_slot = None, [], False
    for state in waiting:
        ref = state.prepared.request.adapter
        if ref is None:
            found = state
            break
        if no_slot:
            continue
        try:
            adapter = store.get(ref, state.submitted, reserved)
        except AdapterError as error:
            refused.append((state, error))
            continue
        if adapter is not None:
            state.adapter, found = adapter, state
            break
        reserved.add(key_of(ref))
        no_slot = not store.loading(ref)
    for state, error in refused:
        waiting.remove(state)
        refuse(state, error)
    return found
