"""The C allocator's setting for a worker process: large blocks go back to the system when freed.

glibc serves a block above its mmap threshold with its own mapping, unmapped on free, but it raises that
threshold to the size of every such block freed (up to 32 MiB). A worker frees hundreds of MB while it
loads (w8a8 drops the float32 projections it replaces), so from then on blocks of a few MB come from the
heap, where freed memory stays in the process: SmolLM2 in w8a8 held ~300 MB more after load and its peak
was ~250 MB higher (a KV cache that grows reuses nothing it can). A fixed threshold keeps every block of
1 MiB or more returnable; smaller ones (most of a decode step's temporaries) stay on the heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h); setting it also turns off the dynamic rule
MMAP_THRESHOLD_BYTES = 1 << 20


def return_large_blocks() -> bool:
    """Set the fixed threshold; False where the C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
