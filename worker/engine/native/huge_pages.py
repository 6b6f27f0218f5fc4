"""The packed matrices' memory in 2 MiB pages where Linux gives them.

Every decode step streams every packed matrix (Gemma 3 270M: 287 MB, its 189 MB vocabulary matrix among them).
In 4 KiB pages each 4 KiB read costs a TLB miss and a page walk: a 16-row Gemma 3 step took 34-36 ms, and 30-31
with every matrix in huge pages (in-process, same run). Either part alone in huge pages gained nothing measurable.

- A large matrix (at least IN_PLACE bytes: the vocabulary's) is collapsed where it lies: its whole 2 MiB-aligned
  stretches advised MADV_HUGEPAGE, then MADV_COLLAPSE (Linux 6.1), which copies 2 MiB at a time and leaves the
  bytes as they were. Copying it elsewhere would hold it twice for a moment: 190 MB more at a load's peak.
- The others (a layer's, 0.4-3 MB each, mostly not spanning a whole aligned huge page) are copied into one
  anonymous mapping, each from a cache line, each one's old memory freed once copied; the mapping is then
  collapsed likewise.

The collapse waits for the worker to be ready (`collapse_all`, NativeForward.collapse_pages). A kernel without it
(or with THP turned off) answers with an error and the memory is ordinary: nothing changes but a copy of the
small matrices at start (0.04 s for Gemma 3).
"""

from __future__ import annotations

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


def in_huge_pages(matrices: dict[str, Packed]) -> tuple[dict[str, Packed], list[torch.Tensor]]:
    """`matrices`, the small ones moved into one mapping, and the memory to collapse (`collapse_all`): that
    mapping and the large matrices. `matrices` is emptied as they move (hold no other reference to their tiles,
    or their memory is not freed meanwhile)."""
    large = {name: matrices.pop(name) for name in list(matrices) if matrices[name].tiles.numel() >= IN_PLACE}
    small, arena = gathered(matrices)
    return large | small, [packed.tiles for packed in large.values()] + [arena]


def collapse_all(regions: list[torch.Tensor]) -> int:
    """`collapse` each region; the bytes moved. The worker runs it in a thread of its own once it is ready: on a
    host whose memory must be compacted first it took 0.9 s for Gemma 3's matrices (0.04 s on a fresh host), and
    beside the warm-up it delayed ready by a second. The bytes never change, so the engine reads them meanwhile."""
    return sum(collapse(region) for region in regions)


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


def gathered(matrices: dict[str, Packed]) -> tuple[dict[str, Packed], torch.Tensor]:
    """The same matrices over one anonymous mapping, the first from a huge page's boundary and each from a cache
    line, and that mapping's memory; `matrices` is emptied as they move. The mapping is not advised before the
    copy: faults in an advised one compact memory for each huge page (0.26 s for 100 MB, against 0.05 s for the
    copy and 0.04 s for the collapse after it)."""
    order = sorted(matrices, key=lambda name: -matrices[name].tiles.numel())
    total = sum(_aligned(matrices[name].tiles.numel(), LINE) for name in order)
    length = _aligned(total, HUGE_PAGE) + HUGE_PAGE  # room to start on a huge page's boundary
    arena = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    memory = torch.frombuffer(arena, dtype=torch.uint8)  # holds `arena` for as long as a view of it lives
    at = first = -memory.data_ptr() % HUGE_PAGE
    moved: dict[str, Packed] = {}
    for name in order:
        packed = matrices.pop(name)
        size = packed.tiles.numel()
        tiles = memory[at:at + size].view(packed.tiles.shape)
        tiles.copy_(packed.tiles)
        moved[name] = Packed(tiles, packed.rows, packed.bits)
        del packed  # the last reference to the old tiles: freed before the next matrix is copied
        at += _aligned(size, LINE)
    return moved, memory[first:at]
