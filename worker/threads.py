"""How many threads a worker's engine uses: torch's intra-op threads and the decode row groups; and
the low-priority threads that finish a worker's start after it began to serve."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable

import torch

from common.protocol import ModelConfig
from worker.settings import environment


def torch_threads(config: ModelConfig) -> int:
    """Explicit config, then the worker's `torch_threads` setting (SLUICE_TORCH_THREADS), else half the cores. On
    a small shared host two OpenMP threads that spin-wait on each other run several times slower than one
    (bench/worker.py)."""
    configured = config.threads or environment().torch_threads
    return configured or max(1, (os.cpu_count() or 2) // 2)


def decode_threads(config: ModelConfig) -> int:
    """Explicit config, else the cores left over by torch's threads: on two cores with one torch
    thread, two row groups decode side by side (1.8x the 16-row step of one thread, bench/worker.py)."""
    return config.decode_threads or max(1, (os.cpu_count() or 1) // torch.get_num_threads())


@contextlib.contextmanager
def intra_op_threads(count: int):
    """torch's intra-op threads on this thread set to `count` for the block. A thread that first runs
    torch code later starts with the value outside any block (torch reads it once per thread)."""
    before = torch.get_num_threads()
    if count == before:
        yield
        return
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


BACKGROUND_NICENESS = 10


def in_background(work: Callable[[], None], name: str) -> threading.Thread:
    """Run `work` in a daemon thread the OS schedules after the engine's (Linux niceness is per
    thread): start-up work that is not needed yet must not slow the first requests."""

    def run() -> None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICENESS)
        work()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread
