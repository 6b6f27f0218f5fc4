"""What the padded per-slot KV cache costs (the numbers behind worker/engine/README.md).

    .venv/bin/python bench/kv_layout.py [--rows 32] [--threads 1]

Measures on SmolLM2-135M's cache shape: bytes per token, the compaction move of one row, the
doubling growth of the time axis, and a decode step whose rows have unequal lengths (attention runs
over the padded view, masked) against one whose rows all have the mean length.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from common.protocol import ModelConfig
from worker.engine.kv_cache import KVCache
from worker.engine.runner import ModelRunner
from worker.loading import load_model

REPO = Path(__file__).resolve().parents[1]


def timed(fn, repeat: int = 5) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with torch.inference_mode():  # as the engine thread runs
        measure(args)


def measure(args) -> None:
    layers, kv_heads, head_dim = 30, 3, 64  # SmolLM2-135M
    cache = KVCache(layers, kv_heads, head_dim, args.rows, 4096, torch.float32, torch.device("cpu"))
    per_token = cache.bytes_per_token()
    print(f"KV bytes per token: {per_token / 1024:.0f} KiB (float32); a padded cache of {args.rows} rows x "
          f"1024 positions holds {args.rows * 1024 * per_token / 2**30:.2f} GiB")
    for length in (128, 512):
        cache.ensure(length, args.rows)  # every slot in use
        cost = timed(lambda length=length, cache=cache: cache.move(args.rows - 1, 0, length))
        print(f"compaction move of one row, {length} positions: {1000 * cost:.2f} ms")
    cache = KVCache(layers, kv_heads, head_dim, args.rows, 4096, torch.float32, torch.device("cpu"))
    cache.ensure(1, args.rows)
    for target in (512, 1024, 2048):  # from the initial 256
        start = time.perf_counter()
        cache.ensure(target)
        cost = time.perf_counter() - start
        print(f"time axis grows to {target}: {1000 * cost:.0f} ms once "
              f"({args.rows * target * per_token / 2**20:.0f} MiB allocated)")
    del cache

    os.environ.setdefault("SLUICE_MODEL_CACHE", str(REPO / ".data" / "test-model-cache"))
    loaded = load_model(ModelConfig(), REPO / ".bench" / "worker")
    runner = ModelRunner(loaded.model, 16, 1024)
    runner.prefill(0, list(range(100, 612)))
    for row in range(1, 16):
        runner.cache.move(0, row, 512)
    ragged = [64 + 448 * row // 15 for row in range(16)]  # 64..512, mean 288
    even = [sum(ragged) // 16] * 16
    for name, lengths in (("equal lengths (288)", even), ("ragged lengths 64..512, padded to 512", ragged)):
        cost = timed(lambda lengths=lengths: runner.decode([5] * 16, lengths))
        print(f"decode step, 16 rows, {name}: {1000 * cost:.0f} ms")


if __name__ == "__main__":
    main()
