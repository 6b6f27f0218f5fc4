"""The scripted decode stack (worker/engine/decode_layer.py) against the eager Python path it replaces.

    .venv/bin/python bench/decode_scripting.py [--rows 1 16] [--repeats 6] [--threads 1]

SmolLM2-135M with a ~100-token cache, float32 and then w8a8 (the two modes that decode through it; q4 runs the
native forward). For each row count: ms per decode step through the scripted stack and through the eager layers,
interleaved in one process, and the ratio eager / scripted (above 1: scripting pays). With more than one row,
also two decode threads (row groups), which only the scripted stack runs in parallel.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from common.protocol import ModelConfig
from worker.engine.runner import ModelRunner
from worker.engine.w8a8 import quantize_runner
from worker.loading import load_model

REPO = Path(__file__).resolve().parents[1]
CONTEXT = 100
STEPS = 5  # decode steps per timing


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per decode thread")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cache = REPO / ".bench" / "worker"
    loaded = load_model(ModelConfig(dtype="float32", quantization="none", device="cpu"), cache)
    with torch.inference_mode():  # as the engine thread runs
        for mode in ("float32", "w8a8"):
            runner = ModelRunner(loaded.model, max(args.rows), 512, decode_threads=2)
            if mode == "w8a8":
                quantize_runner(runner, loaded.tokenizer, cache=cache / "w8a8")
            for slot in range(max(args.rows)):
                runner.prefill(slot, list(range(100, 100 + CONTEXT)))
            stack = runner.scripted_layers()
            if stack is None:
                print(f"{mode}: the layers do not script; nothing to compare")
                continue
            for rows in args.rows:
                for threads in (1, 2) if rows > 1 else (1,):
                    scripted, eager = compare(runner, stack, rows, threads, args.repeats)
                    print(f"{mode:8} rows={rows:3} decode threads={threads}: scripted {scripted:7.1f} ms/step, "
                          f"eager {eager:7.1f} ms/step, eager/scripted {eager / scripted:.2f}x", flush=True)


def compare(runner: ModelRunner, stack: torch.jit.ScriptModule, rows: int, threads: int,
            repeats: int) -> tuple[float, float]:
    """Median ms per step of each path, the two interleaved so that a busy machine slows both alike."""
    times: dict[str, list[float]] = {"scripted": [], "eager": []}
    for _ in range(repeats):
        for path in times:
            runner._decode_layers = stack if path == "scripted" else None  # None: the eager path
            step(runner, rows, threads)  # warm
            start = time.perf_counter()
            for _ in range(STEPS):
                step(runner, rows, threads)
            times[path].append((time.perf_counter() - start) / STEPS * 1000)
    return statistics.median(times["scripted"]), statistics.median(times["eager"])


def step(runner: ModelRunner, rows: int, threads: int) -> None:
    tokens, lengths = [5] * rows, [CONTEXT] * rows
    if threads > 1:
        runner.decode_groups(tokens, lengths, threads=threads)
    else:
        runner.decode(tokens, lengths)


if __name__ == "__main__":
    main()
