"""How many threads a worker's engine uses: torch's intra-op threads and the decode row groups."""

from __future__ import annotations

import contextlib
import os

import torch

from common.protocol import ModelConfig


def torch_threads(config: ModelConfig) -> int:
    """Explicit config, then SLUICE_TORCH_THREADS, else half the cores. On a small shared host two
    OpenMP threads that spin-wait on each other run several times slower than one (bench/worker.py)."""
    configured = config.threads or int(os.environ.get("SLUICE_TORCH_THREADS") or 0)
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
