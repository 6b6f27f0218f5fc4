"""Every index and shape a native forward call goes through, checked before forward.c sees it.

forward.c writes each token's key and value at [slot, kv head, position] of every layer's cache and reads the
rotary table at that position: a position at or past a layer's capacity lands in the next slot's rows (another
request's keys and values), a slot past the cache's is memory outside it. So a call is refused here with a
`ValueError` naming what is out of range, before any pointer is taken; forward.c repeats the index checks as
its last guard (it returns BAD_INDEX and touches nothing). Token ids are checked where the native paths embed
them (runner.py): the packed embedding wraps a negative id and reads a padding row past the vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

KV_DTYPE = torch.float16  # forward.c's kv_t


def check_tokens(token_ids: Sequence[int], vocab_size: int) -> None:
    """Every id names a row of the vocabulary."""
    if token_ids and (min(token_ids) < 0 or max(token_ids) >= vocab_size):
        bad = next(t for t in token_ids if not 0 <= t < vocab_size)
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab_size})")


def _within(name: str, values: Sequence[int], end: int, what: str) -> None:
    if values and (min(values) < 0 or max(values) >= end):
        bad = next(v for v in values if not 0 <= v < end)
        raise ValueError(f"{name} {bad} is outside [0, {end}): {what}")


def check_call(*, hidden: torch.Tensor, hidden_size: int, slots: Sequence[int], positions: Sequence[int],
               keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], out_rows: Sequence[int],
               layers: int, kv_heads: int, head_dim: int, max_positions: int) -> None:
    """Raise ValueError unless `NativeForward.run`'s arguments are a call forward.c computes in bounds."""
    count = len(slots)
    if count < 1:
        raise ValueError("a native forward call needs at least one token")
    if len(positions) != count:
        raise ValueError(f"{count} slots but {len(positions)} positions: one of each per token")
    if hidden.dtype != torch.float32 or tuple(hidden.shape) != (count, hidden_size) or not hidden.is_cpu:
        raise ValueError(f"hidden must be float32 [{count}, {hidden_size}] on the CPU, not {hidden.dtype} "
                         f"{list(hidden.shape)} on {hidden.device}")
    if len(keys) != layers or len(values) != layers:
        raise ValueError(f"the model has {layers} layers: got {len(keys)} key and {len(values)} value tensors")
    slot_count = capacity = None
    for index, (key, value) in enumerate(zip(keys, values)):  # a decode step's cost: attribute reads only
        shape = key.shape
        if key.dtype is not KV_DTYPE or value.dtype is not KV_DTYPE:
            raise ValueError(f"layer {index}: the KV cache must be stored as {KV_DTYPE}")
        if len(shape) != 4 or shape != value.shape or shape[1] != kv_heads or shape[3] != head_dim:
            raise ValueError(f"layer {index}: keys and values must both be [slots, {kv_heads}, capacity, "
                             f"{head_dim}], not {list(shape)} and {list(value.shape)}")
        if not (key.is_cpu and value.is_cpu and key.is_contiguous() and value.is_contiguous()):
            raise ValueError(f"layer {index}: keys and values must be contiguous CPU tensors")
        slot_count = shape[0] if slot_count is None else min(slot_count, shape[0])
        capacity = shape[2] if capacity is None else min(capacity, shape[2])
    _within("slot", slots, slot_count, "the cache's slots")
    room = min(capacity, max_positions)
    _within("position", positions, room, f"the cache holds {capacity} positions, the rotary table {max_positions}")
    if len(out_rows) > count:
        raise ValueError(f"{len(out_rows)} output rows of a {count}-token call")
    _within("output row", out_rows, count, "a row of the call's tokens")
