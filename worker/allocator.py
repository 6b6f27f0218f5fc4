"""The C allocator's setting for a worker process: large blocks go back to the system when freed.

glibc serves a block above its mmap threshold with its own mapping, unmapped on free, but it raises that
threshold to the size of every such block freed (up to 32 MiB). A worker frees hundreds of MB while it
loads (w8a8 drops the float32 projections it replaces), so from then on blocks of a few MB come from the
heap, where freed memory stays in the process: SmolLM2 in w8a8 held ~300 MB more after load and its peak
was ~250 MB higher (a KV cache that grows reuses nothing it can). A fixed threshold keeps every block of
1 MiB or more returnable; smaller ones (most of a decode step's temporaries) stay on the heap.

What is freed among those smaller blocks stays in the process too, scattered between live ones where only
`malloc_trim` finds it: SmolLM2 in q4 serving 16 streams held ~85 MB of it, a tenth of its peak. A thread
(`trim_periodically`) hands it back every TRIM_INTERVAL_S; ctypes releases the GIL for the call. A trim costs
about a millisecond over a few hundred MB of heap plus the pages it returns (200 MB at once: ~0.1 s), and
holds each arena's lock meanwhile: a second between trims keeps what each returns small.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h); setting it also turns off the dynamic rule
MMAP_THRESHOLD_BYTES = 1 << 20
TRIM_INTERVAL_S = 1.0


def return_large_blocks() -> bool:
    """Set the fixed threshold; False where the C library is not glibc (nothing changed)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def trim_now() -> bool:
    """Return the heap's free pages to the system once (a process without the trim thread: a grammar compile
    process after it built its vocabulary table or compiled a constraint); False where the C library is not glibc."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim(0)
    return True


def trim_periodically(interval_s: float = TRIM_INTERVAL_S) -> bool:
    """Start a daemon thread that returns the heap's free pages to the system every `interval_s`; False where
    the C library is not glibc (nothing started)."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False

    def loop() -> None:
        while True:
            time.sleep(interval_s)
            trim(0)

    threading.Thread(target=loop, name="sluice-malloc-trim", daemon=True).start()
    return True
