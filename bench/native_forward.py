"""The native forward (q4, worker/engine/native/) against torch's float32 (and w8a8) forward, same run.

    .venv/bin/python bench/native_forward.py [--threads 1] [--sizes 1,4,16,64] [--chunks 64,256,512]
                                             [--context 128] [--repeat 3] [--no-w8a8]

SmolLM2-135M, one runner per path over its own copy of the weights (one at a time). Two shapes:
- decode steps: N rows (slots 0..N-1), each one token at position `--context` (attention over that many);
- prefill chunks: one slot's N consecutive positions from 0, the last position's logits (what runner.py's
  prefill asks for).
Prints the fastest call's seconds, tokens per second and the ratio torch / native (> 1: native faster).
`--threads`: the native team's size and torch's intra-op threads. With one thread the clock is the process's
CPU time (steadier than wall time on a shared host: a busy neighbour does not count), else wall time.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

import torch

# run as a script, this folder leads sys.path and bench/worker.py would shadow the `worker` package
sys.path.remove(str(Path(__file__).resolve().parent))

from common.protocol import ModelConfig
from worker.engine.native.model import NativeForward
from worker.engine.runner import ModelRunner
from worker.engine.w8a8 import quantize_runner
from worker.loading import load_model
from worker.lora.delta import NO_LORA

REPO = Path(__file__).resolve().parents[1]


def timed(fn, repeat: int, clock) -> float:
    """The fastest of `repeat` calls (after one warm-up) on `clock`."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


def decode_step(runner: ModelRunner, rows: int, context: int):
    tokens, lengths = [17] * rows, [context] * rows
    if runner.native is not None:
        return lambda: runner._native_decode(tokens, lengths, False, {}, None)
    return lambda: runner._decode_rows(0, tokens, lengths, False, {})


def prefill_chunk(runner: ModelRunner, length: int):
    ids = [(7 * i) % 1000 + 10 for i in range(length)]
    if runner.native is not None:
        return lambda: runner._native_prefill(0, ids, 0, None, False, False, runner.native.threads)
    return lambda: runner._prefill(0, ids, 0, None, False, False, NO_LORA)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", default="1,4,16,64")
    parser.add_argument("--chunks", default="64,256,512")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-w8a8", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    chunks = [int(s) for s in args.chunks.split(",") if s]
    torch.set_num_threads(args.threads)
    os.environ.setdefault("SLUICE_MODEL_CACHE", str(REPO / ".data" / "test-model-cache"))
    loaded = load_model(ModelConfig(dtype="float32", quantization="none"), REPO / ".data")
    paths = ["native", "torch"] + ([] if args.no_w8a8 else ["w8a8"])
    shapes = [(f"prefill chunk {n}", n, lambda r, n=n: prefill_chunk(r, n)) for n in chunks]
    shapes += [(f"decode {n} x ctx {args.context}", n, lambda r, n=n: decode_step(r, n, args.context)) for n in sizes]
    clock = time.process_time if args.threads == 1 else time.perf_counter
    seconds: dict[tuple[str, str], float] = {}
    rows, context = max(sizes, default=1), max([args.context + 1, *chunks])
    for path in paths:  # one runner at a time: each holds a copy of the weights and its own KV cache
        runner = ModelRunner(copy.deepcopy(loaded.model), rows, context)
        if path == "native":
            runner.native = NativeForward(runner, threads=args.threads)
        elif path == "w8a8":
            quantize_runner(runner, loaded.tokenizer, release=True)
        for label, tokens, make in shapes:  # chunks first: the cache holds one slot while they run
            if label.startswith("prefill"):
                runner.cache.ensure(tokens, 1)
            else:
                runner.cache.ensure(args.context + 1, tokens)
            with torch.inference_mode():
                seconds[path, label] = timed(make(runner), args.repeat, clock)
        del runner
    print(f"threads {args.threads}, {'CPU' if args.threads == 1 else 'wall'} seconds of the fastest call, "
          "tokens/s, and each torch path's time / native's")
    print(f"{'shape':<22}" + "".join(f"{name + ' s':>12}{name + ' tok/s':>14}" for name in paths)
          + "".join(f"{name + '/native':>14}" for name in paths[1:]))
    for label, tokens, _ in shapes:
        line = f"{label:<22}" + "".join(f"{seconds[n, label]:>12.4f}{tokens / seconds[n, label]:>14.1f}" for n in paths)
        line += "".join(f"{seconds[n, label] / seconds['native', label]:>14.2f}" for n in paths[1:])
        print(line, flush=True)

if __name__ == "__main__":
    main()
