"""What a server process built before it serves lives as long as the process: the cycle collector need not walk it."""

from __future__ import annotations

import gc


def freeze_what_lives_on() -> None:
    """Collect once, then move every object alive now out of the collector's generations (`gc.freeze`): a full
    collection walks only what came after. A loaded worker holds ~335,000 tracked objects (modules, the model's
    containers, the tokenizer), and each full collection walked them with the GIL held for 160-185 ms: no step,
    token or HTTP answer of that process ran meanwhile. Objects frozen here that later become cyclic garbage stay
    until exit, so call it once the process holds what it serves with, not before each request."""
    gc.collect()
    gc.freeze()
