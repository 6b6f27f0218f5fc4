"""Padded per-row KV cache: one tensor per layer, rows are slots, the time axis grows by doubling.

Active rows always occupy slots 0..B-1, so a decode step attends over a view `[:B, :, :T]` with no
copy. A row that leaves is replaced by a later row (one row copied; slots.py says which); `gather`
reorders or duplicates rows (n > 1 forks, beams) in one indexed copy.

Memory follows use: the slot axis too grows as slots are first written (in steps of ROW_STEP, up to
`max_rows`), so a worker configured for 32 rows that serves 16 holds the KV of 16 (SmolLM2 in float32:
45 KiB per row and position).
"""

from __future__ import annotations

import torch

ROW_STEP = 4  # slots added at a time: a burst of joining rows grows the cache once, not per row


class KVCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, max_rows: int, max_context: int,
                 dtype: torch.dtype, device: torch.device, initial_context: int = 256):
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.max_rows, self.max_context = max_rows, max_context
        self.dtype, self.device = dtype, device
        self.capacity = min(initial_context, max_context)
        self.rows = min(ROW_STEP, max_rows)  # slots allocated
        shape = (self.rows, kv_heads, self.capacity, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    def ensure(self, length: int, rows: int = 0) -> None:
        """Grow the time axis so `length` positions fit (amortised doubling, capped at max_context), and
        the slot axis so slots 0..rows-1 exist (zeros until written)."""
        if length > self.max_context:
            raise ValueError(f"sequence of {length} tokens exceeds the context of {self.max_context}")
        new_capacity = self.capacity if length <= self.capacity else \
            min(max(length, self.capacity * 2), self.max_context)
        new_rows = self.rows if rows <= self.rows else max(rows, min(-(-rows // ROW_STEP) * ROW_STEP, self.max_rows))
        if (new_rows, new_capacity) == (self.rows, self.capacity):
            return
        for store in (self.keys, self.values):
            for index, old in enumerate(store):  # one layer at a time: the old tensor is freed before the next
                grown = torch.zeros((new_rows, self.kv_heads, new_capacity, self.head_dim),
                                    dtype=self.dtype, device=self.device)
                grown[: self.rows, :, : self.capacity] = old
                store[index] = grown
        self.rows, self.capacity = new_rows, new_capacity

    def decode_slots(self, first: int, rows: int, positions: torch.Tensor) -> torch.Tensor:
        """Where slots first..first+rows-1 write position `positions[b]`, as indices into a layer viewed
        as [slots * kv_heads * capacity, head_dim] (so a decode write is one index_copy_ per tensor)."""
        heads = torch.arange(self.kv_heads, device=self.device)
        base = torch.arange(first, first + rows, device=self.device).unsqueeze(1) * self.kv_heads + heads
        return (base * self.capacity + positions.unsqueeze(1)).flatten()

    def write_decode(self, keys: torch.Tensor, values: torch.Tensor, slots: torch.Tensor,
                     key: torch.Tensor, value: torch.Tensor) -> None:
        """key, value: [rows, 1, kv_heads, head_dim] of one layer, written where `decode_slots` says."""
        keys.view(-1, self.head_dim).index_copy_(0, slots, key.reshape(-1, self.head_dim))
        values.view(-1, self.head_dim).index_copy_(0, slots, value.reshape(-1, self.head_dim))

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

    def bytes_per_token(self) -> int:
        element = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * element
