"""Padded per-row KV cache: one tensor per layer, rows are slots, the time axis grows by doubling.

Active rows always occupy slots 0..B-1, so a decode step attends over a view `[:B, :, :T]` with no
copy. A row that leaves is replaced by a later row (one row copied; slots.py says which); `gather`
reorders or duplicates rows (n > 1 forks, beams) in one indexed copy.

Memory follows use: the slot axis too grows as slots are first written (in steps of ROW_STEP, up to
`max_rows`), so a worker configured for 32 rows that serves 16 holds the KV of 16 (SmolLM2 in float32:
45 KiB per row and position).

The storage dtype is the model's compute dtype, except under the native forward (q4), which stores keys and
values in float16 (`store_as`): half the memory, and what forward.c reads and writes. Torch paths that share
such a cache (LoRA rows, long prefill chunks) write through a conversion and read widened copies (`widened`).

Growing the time axis copies a layer into a larger tensor (GROWTH times as large): for 17 slots of
SmolLM2-135M in float32, 1,024 -> 1,536 positions allocates 1.2 GB, a stall of most of a second. `ensure`
grows every layer at once (what a forward needs now); `grow_layer` grows one layer at a time, so the
scheduler can spread the growth a long prompt needs over the steps before its prefill reaches it. Meanwhile
layers differ in capacity: `capacity` is what every layer holds, and `decode_slots` gives each layer its own
write positions.
"""

from __future__ import annotations

import torch

ROW_STEP = 4  # slots added at a time: a burst of joining rows grows the cache once, not per row
# each growth of the time axis: every slot holds the longest row's positions, so the unused tail of a doubling
# (16 rows of ~300 positions at 512) is memory no row uses; 1.5 costs one growth more per 4x of length
GROWTH = 1.5


class KVCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_rows: int, max_context: int,
                 dtype: torch.dtype, device: torch.device, initial_context: int = 256):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.max_rows, self.max_context = max_rows, max_context
        self.dtype, self.device = dtype, device
        self.capacity = min(initial_context, max_context)  # positions every layer holds
        self.capacities = [self.capacity] * layers  # each layer's, larger while the cache grows layer by layer
        self.rows = min(ROW_STEP, max_rows)  # slots allocated, the same in every layer
        shape = (self.rows, kv_heads, self.capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    def store_as(self, dtype: torch.dtype) -> None:
        """Hold keys and values in `dtype` from now on (contents converted)."""
        self.dtype = dtype
        self.keys = [t.to(dtype) for t in self.keys]
        self.values = [t.to(dtype) for t in self.values]

    def grown(self, length: int) -> int:
        """The capacity to grow to so `length` positions fit (amortised: GROWTH times what the largest layer
        holds, capped at max_context)."""
        if length > self.max_context:
            raise ValueError(f"sequence of {length} tokens exceeds the context of {self.max_context}")
        largest = max(self.capacities)
        return largest if length <= largest else min(max(length, int(largest * GROWTH)), self.max_context)

    def ensure(self, length: int, rows: int = 0) -> None:
        """Grow the time axis of every layer so `length` positions fit, and the slot axis so slots
        0..rows-1 exist (zeros until written)."""
        capacity = self.capacity if length <= self.capacity else self.grown(length)
        new_rows = self.rows if rows <= self.rows else max(rows, min(-(-rows // ROW_STEP) * ROW_STEP, self.max_rows))
        for index, held in enumerate(self.capacities):  # one layer at a time: the old tensor is freed first
            if new_rows > self.rows or held < capacity:
                self._reallocate(index, new_rows, max(held, capacity))
        self.rows = new_rows

    def grow_layer(self, capacity: int) -> bool:
        """Grow the first layer that holds fewer than `capacity` positions to hold that many; False when none
        does."""
        index = next((i for i, held in enumerate(self.capacities) if held < capacity), None)
        if index is None:
            return False
        self._reallocate(index, self.rows, capacity)
        return True

    def _reallocate(self, index: int, rows: int, capacity: int) -> None:
        """Layer `index` with `rows` slots of `capacity` positions, its contents kept."""
        held = self.capacities[index]
        for store in (self.keys, self.values):
            grown = torch.zeros((rows, self.kv_heads, capacity, self.head_dim), dtype=self.dtype, device=self.device)
            grown[: self.rows, :, :held] = store[index]
            store[index] = grown
        self.capacities[index] = capacity
        self.capacity = min(self.capacities)

    def decode_slots(self, first: int, rows: int, positions: torch.Tensor) -> list[torch.Tensor]:
        """Where slots first..first+rows-1 write position `positions[b]` in each layer, as indices into the
        layer viewed as [slots * kv_heads * its capacity, head_dim] (a decode write is one index_copy_ per
        tensor)."""
        heads = torch.arange(self.kv_heads, device=self.device)
        base = torch.arange(first, first + rows, device=self.device).unsqueeze(1) * self.kv_heads + heads
        by_capacity = {held: (base * held + positions.unsqueeze(1)).flatten() for held in set(self.capacities)}
        return [by_capacity[held] for held in self.capacities]

    def write_decode(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                     key: torch.Tensor, value: torch.Tensor) -> None:
        """key, value: [rows, 1, kv_heads, head_dim] of one layer, written where `decode_slots` says."""
        keys.view(-1, self.head_dim).index_copy_(0, slots, key.reshape(-1, self.head_dim).to(keys.dtype))
        values.view(-1, self.head_dim).index_copy_(0, slots, value.reshape(-1, self.head_dim).to(values.dtype))

    def move(self, source: int, target: int, length: int) -> None:
        """Copy slot `source` into slot `target` (first `length` positions)."""
        self.ensure(length, max(source, target) + 1)
        for store in (self.keys, self.values):
            for layer in store:
                layer[target, :, :length] = layer[source, :, :length]

    def copy_out(self, slot: int, start: int, end: int) -> torch.Tensor:
        """Positions start..end-1 of a slot, every layer, as one new tensor
        [layers, 2 (keys, values), kv_heads, positions, head_dim]: a preempted row set aside, prefix blocks."""
        return torch.stack([torch.stack((keys[slot, :, start:end], values[slot, :, start:end]))
                            for keys, values in zip(self.keys, self.values)])

    def copy_in(self, slot: int, kv: torch.Tensor) -> None:
        """Write what `copy_out` gave into positions 0.. of `slot` (any slot: a row resumes where it is placed)."""
        length = kv.shape[3]
        self.ensure(length, slot + 1)
        for layer, (keys, values) in enumerate(zip(self.keys, self.values)):
            keys[slot, :, :length] = kv[layer, 0]
            values[slot, :, :length] = kv[layer, 1]

    def clear(self, slot: int) -> None:
        """Zero a slot. A row that failed may leave NaN there, and the next row placed in it attends over
        the positions past its own length masked: a masked NaN is still NaN (0 x NaN)."""
        if slot >= self.rows:  # never written: zeros
            return
        for store in (self.keys, self.values):
            for layer in store:
                layer[slot].zero_()

    def swap(self, first: int, second: int, length: int) -> None:
        """Slots `first` and `second` trade contents (first `length` positions)."""
        self.ensure(length, max(first, second) + 1)
        for store in (self.keys, self.values):
            for layer in store:
                held = layer[first, :, :length].clone()
                layer[first, :, :length] = layer[second, :, :length]
                layer[second, :, :length] = held

    def gather(self, index: list[int], length: int) -> None:
        """Slots 0..len(index)-1 become the old slots `index` (may repeat or drop rows)."""
        order = torch.tensor(index, device=self.device)
        rows = len(index)
        self.ensure(length, max([rows, *(i + 1 for i in index)]))
        for store in (self.keys, self.values):
            for layer in store:
                layer[:rows, :, :length] = layer.index_select(0, order)[:, :, :length]

    def copy_rows(self, targets: list[int], sources: list[int], start: int, end: int) -> None:
        """Slots `targets[i]` take the old contents of slots `sources[i]` over positions start..end-1;
        every other slot is untouched (a beam request rewrites only its own rows)."""
        if not targets or start >= end:
            return
        self.ensure(end, max(*targets, *sources) + 1)
        target = torch.tensor(targets, device=self.device)
        source = torch.tensor(sources, device=self.device)
        for store in (self.keys, self.values):
            for layer in store:
                window = layer.narrow(2, start, end - start)
                window.index_copy_(0, target, window.index_select(0, source))  # select copies first

    def layer_bytes(self, capacity: int) -> int:
        """Bytes of one layer's keys and values at `capacity` positions."""
        return 2 * self.rows * self.kv_heads * capacity * self.head_dim * self._element_size()

    def bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self._element_size()

    def _element_size(self) -> int:
        return torch.tensor([], dtype=self.dtype).element_size()


def widened(stored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A cache view in the compute `dtype`: itself where the cache stores that dtype, else a converted copy."""
    return stored if stored.dtype == dtype else stored.to(dtype)
