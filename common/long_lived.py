"""What a server process built before it serves lives as long as the process: the cycle collector need not walk it."""

from __future__ import annotations

import atexit
import gc


def freeze_what_lives_on() -> None:
    """Collect once, then move every object alive now out of the collector's generations (`gc.freeze`): a full
    collection walks only what came after. A loaded worker holds ~335,000 tracked objects (modules, the model's
    containers, the tokenizer), and each full collection walked them with the GIL held for 160-185 ms: no step,
    token or HTTP answer of that process ran meanwhile. Objects frozen here that later become cyclic garbage stay
    until exit, so call it once the process holds what it serves with, not before each request. At exit they are
    unfrozen first: the interpreter's last collections then finalize them in the order they would have (objects of
    C++ libraries that stop their own threads when collected: left frozen, the process could abort at exit)."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # once, however often it is called
    atexit.register(gc.unfreeze)
