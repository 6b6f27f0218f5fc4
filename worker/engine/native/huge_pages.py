"""The packed matrices' memory in 2 MiB pages where Linux gives them.

Every decode step streams every packed matrix (Gemma 3 270M: 287 MB, its 189 MB vocabulary matrix among them).
In 4 KiB pages each 4 KiB read costs a TLB miss and a page walk: a 16-row Gemma 3 step took 34-36 ms, and 30-31
with every matrix in huge pages (in-process, same run). Either part alone in huge pages gained nothing measurable.

- A large matrix (at least IN_PLACE bytes: the vocabulary's) is collapsed where it lies: its whole 2 MiB-aligned
  stretches advised MADV_HUGEPAGE, then MADV_COLLAPSE (Linux 6.1), which copies 2 MiB at a time and leaves the
  bytes as they were. Copying it elsewhere would hold it twice for a moment: 190 MB more at a load's peak.
- The others (a layer's, 0.4-3 MB each, mostly not spanning a whole aligned huge page) are copied into one
  anonymous mapping advised MADV_HUGEPAGE, each from a cache line, each one's old memory freed once copied.

A kernel without these (or with THP turned off) answers with an error and the memory is ordinary: nothing changes
but a copy of the small matrices at start.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
from functools import cache

import torch

from worker.engine.native.pack import Packed

HUGE_PAGE = 2 << 20
IN_PLACE = 32 << 20  # a matrix this large is collapsed where it lies; smaller ones are gathered
LINE = 64
MADV_HUGEPAGE, MADV_COLLAPSE = 14, 25  # <asm-generic/mman-common.h>


def in_huge_pages(matrices: dict[str, Packed]) -> dict[str, Packed]:
    """`matrices`, the large ones collapsed in place and the others moved into one mapping; `matrices` is
    emptied as they move (hold no other reference to their tiles, or their memory is not freed meanwhile)."""
    large = {name: matrices.pop(name) for name in list(matrices) if matrices[name].tiles.numel() >= IN_PLACE}
    for packed in large.values():
        collapse(packed.tiles)
    return large | gathered(matrices)


@cache
def _madvise():
    """libc's madvise, or None where there is none to call."""
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).madvise
    except (OSError, AttributeError, TypeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


def collapse(tensor: torch.Tensor) -> int:
    """Move the whole 2 MiB pages inside a contiguous `tensor`'s memory to huge pages, in place; the bytes moved
    (0 where the kernel refused, or the tensor spans no whole huge page)."""
    madvise = _madvise()
    start = -(-tensor.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    end = (tensor.data_ptr() + tensor.numel() * tensor.element_size()) // HUGE_PAGE * HUGE_PAGE
    if madvise is None or end <= start or not tensor.is_contiguous():
        return 0
    if madvise(start, end - start, MADV_HUGEPAGE) != 0 or madvise(start, end - start, MADV_COLLAPSE) != 0:
        return 0
    return end - start


def _aligned(size: int, to: int) -> int:
    return (size + to - 1) // to * to


def gathered(matrices: dict[str, Packed]) -> dict[str, Packed]:
    """The same matrices over one mapping advised for huge pages, the first from a huge page's boundary and each
    from a cache line; `matrices` is emptied as they move."""
    order = sorted(matrices, key=lambda name: -matrices[name].tiles.numel())
    total = sum(_aligned(matrices[name].tiles.numel(), LINE) for name in order)
    if total == 0:
        return {name: matrices.pop(name) for name in order}
    length = _aligned(total, HUGE_PAGE) + HUGE_PAGE  # room to start on a huge page's boundary
    arena = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory = torch.frombuffer(arena, dtype=torch.uint8)  # holds `arena` for as long as a view of it lives
    at = -memory.data_ptr() % HUGE_PAGE
    with contextlib.suppress(AttributeError, OSError, ValueError):  # no madvise, or no such advice here
        arena.madvise(mmap.MADV_HUGEPAGE, at, length - at)
    moved: dict[str, Packed] = {}
    for name in order:
        packed = matrices.pop(name)
        size = packed.tiles.numel()
        tiles = memory[at:at + size].view(packed.tiles.shape)
        tiles.copy_(packed.tiles)
        moved[name] = Packed(tiles, packed.rows, packed.bits)
        del packed  # the last reference to the old tiles: freed before the next matrix is copied
        at += _aligned(size, LINE)
    return moved
