"""common/long_lived.py: what a server built before it serves is out of the cycle collector's walks."""

from __future__ import annotations

import gc
import weakref

import torch

from common.long_lived import freeze_what_lives_on


class Node:
    pass


def test_a_full_collection_walks_what_came_after_the_freeze_only():
    """The objects alive at the freeze (here a model's module containers, as a loaded worker holds) are no longer
    among those a collection walks; cyclic garbage made afterwards is still collected."""
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(50)])
    try:
        assert any(tracked is model._modules for tracked in gc.get_objects())
        freeze_what_lives_on()
        assert gc.get_freeze_count() > 0
        assert not any(tracked is model._modules for tracked in gc.get_objects())
        first, second = Node(), Node()
        first.other, second.other = second, first
        gone = weakref.ref(first)
        del first, second
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()  # the rest of the test process collects as before
