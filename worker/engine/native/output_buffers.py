"""Memory the native forward writes its logits into, kept from one call to the next once nothing refers to it.

A worker serves every block of 1 MiB or more with a fresh mapping (worker/allocator.py), so a step's logits (16
rows x 262,144 tokens of Gemma 3: 16 MB) were page-faulted and zeroed by the kernel at every decode step: 4 ms of
a 39 ms step. Here a step's logits are a view of a buffer the engine keeps; the buffer is handed out again only
when no tensor or array made from it is alive (a tensor from `torch.frombuffer` holds a reference to its
buffer until its storage is freed, views included), so nothing a step kept is overwritten. At most KEPT
buffers of at most MAX_KEPT_BYTES each stay; larger outputs (a long prompt's logits for every position) or more
of them at once get memory of their own, as before.
"""

from __future__ import annotations

import sys

import torch

KEPT = 2
MAX_KEPT_BYTES = 32 << 20  # 32 rows of a 262,144-token vocabulary


class OutputBuffers:
    def __init__(self) -> None:
        self._buffers: list[bytearray] = []
        self._buffers.append(bytearray(0))  # what the count reads for a buffer only this list holds
        self._unreferenced = self._references(0)
        self._buffers.clear()

    def _references(self, index: int) -> int:
        return sys.getrefcount(self._buffers[index])

    def _view(self, index: int, rows: int, cols: int) -> torch.Tensor:
        return torch.frombuffer(self._buffers[index], dtype=torch.float32, count=rows * cols).view(rows, cols)

    def empty(self, rows: int, cols: int) -> torch.Tensor:
        """An uninitialized [rows, cols] float32 tensor, over kept memory where some is free."""
        need = rows * cols * 4
        if need > MAX_KEPT_BYTES or need == 0:
            return torch.empty(rows, cols)
        free = None
        for index in range(len(self._buffers)):
            if self._references(index) == self._unreferenced:  # no view of it is alive
                if len(self._buffers[index]) >= need:
                    return self._view(index, rows, cols)
                free = index
        if len(self._buffers) < KEPT:
            self._buffers.append(bytearray(need))
            return self._view(len(self._buffers) - 1, rows, cols)
        if free is not None:  # a free one too small: replaced by one that fits
            self._buffers[free] = bytearray(need)
            return self._view(free, rows, cols)
        return torch.empty(rows, cols)
