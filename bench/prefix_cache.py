"""Prefix caching: TTFT of a request whose 1,024-token prefix another request already prefilled, same run.

    .venv/bin/python bench/prefix_cache.py [--quick] [--prefix 1024] [--pairs 3] [--threads 1]
                                           [--quantization auto] [--dtype auto]

One Engine in-process (as bench/worker.py drives it), SmolLM2-135M in the worker's default configuration
unless --quantization / --dtype say otherwise. Each pair is two greedy
one-token requests of the same tenant that share a `--prefix`-token prefix and differ in a short question:
the first prefills the whole prompt, the second finds the prefix's blocks in the cache
(worker/engine/prefix_cache.py) and prefills only its question. TTFT = submit -> first token. The peer, in the
same invocation: the same pairs on the same weights with `prefix_cache_bytes = 0`, where the second request
prefills everything again. Prints each side's TTFT p50 for the first and the second request, the ratio
second / first (the bar: <= 0.25 with the cache) and `cached_tokens` of the second. Each pair uses a prefix
of its own, so no pair finds an earlier pair's blocks. The development box is shared with other engineers'
runs: compare the ratios, not the times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

# run as a script, this file's folder comes first on sys.path and its name would shadow the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from common.protocol import Done, Error, GenerateRequest, ModelConfig, SamplingParams, Token
from worker.engine.engine import Engine
from worker.loading import load_model

REPO = Path(__file__).resolve().parents[1]
QUESTIONS = [" Question: what is the main topic above?", " Question: name one person mentioned above."]


def prefix_ids(tokenizer, tokens: int, pair: int) -> list[int]:
    """A `tokens`-long prefix, different for every pair (a numbered document of repeated prose)."""
    text = f"Document {pair}. " + " ".join(f"Paragraph {n}: the river keeps its course past the old mill, and "
                                           f"the miller counts sacks of grain by lamplight." for n in range(400))
    return tokenizer(text).input_ids[:tokens]


def ttft(engine: Engine, ids: list[int], tenant: str) -> tuple[float, int]:
    """Seconds from submit to the first token, and the request's cached prompt tokens."""
    first, ended = threading.Event(), threading.Event()
    result = {"cached": 0, "first": 0.0}

    def sink(events) -> None:
        for event in events:
            if isinstance(event, Token) and not first.is_set():
                result["first"] = time.perf_counter()
                first.set()
            elif isinstance(event, Done):
                result["cached"] = event.cached_tokens
            elif isinstance(event, Error):
                raise SystemExit(f"the engine refused the request: {event.message}")
        if any(isinstance(e, (Done, Error)) for e in events):
            ended.set()

    request = GenerateRequest(request_id=f"prefix-{time.perf_counter_ns()}", model="m", prompt_ids=ids, tenant=tenant,
                              params=SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    started = time.perf_counter()
    engine.submit(engine.prepare(request), sink)
    if not ended.wait(600):
        raise SystemExit("no answer in 600 s")
    return result["first"] - started, result["cached"]


def measure(engine: Engine, tokenizer, prefix: int, pairs: int, offset: int) -> tuple[list[float], list[float], int]:
    firsts, seconds, cached = [], [], 0
    for pair in range(pairs):
        shared = prefix_ids(tokenizer, prefix, offset + pair)
        question = [tokenizer(q, add_special_tokens=False).input_ids for q in QUESTIONS]
        first, _ = ttft(engine, shared + question[0], "bench")
        second, cached = ttft(engine, shared + question[1], "bench")
        firsts.append(first)
        seconds.append(second)
    return firsts, seconds, cached


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", default=os.environ.get("SLUICE_BENCH_QUICK") == "1")
    parser.add_argument("--prefix", type=int, default=1024, help="shared prefix tokens")
    parser.add_argument("--pairs", type=int, default=None, help="pairs of requests per side")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the worker's default on 2 cores)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda where present)")
    parser.add_argument("--quantization", default="auto", help="as the worker's model config (auto: its default)")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    pairs = args.pairs or (2 if args.quick else 3)
    os.environ.setdefault("SLUICE_MODEL_CACHE", str(REPO / ".data" / "test-model-cache"))
    torch.set_num_threads(args.threads)
    config = {"device": args.device, "dtype": args.dtype, "quantization": args.quantization}
    loaded = load_model(ModelConfig(**config), REPO / ".bench" / "prefix_cache")
    print(f"SmolLM2-135M {loaded.quantization} {loaded.model.dtype} on {loaded.device}; {args.prefix}-token "
          f"shared prefix, {pairs} pairs per side, one-token greedy requests; load average at start "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (shared machine: compare ratios)")
    rows = []
    for label, size in (("prefix cache on", ModelConfig().prefix_cache_bytes), ("prefix cache off", 0)):
        engine = Engine(loaded, ModelConfig(**config, max_context=2048, prefix_cache_bytes=size))
        engine.start()
        try:
            ttft(engine, prefix_ids(loaded.tokenizer, 32, 10_000), "warm-up")
            firsts, seconds, cached = measure(engine, loaded.tokenizer, args.prefix, pairs, offset=len(rows) * 100)
        finally:
            engine.stop()
        first, second = statistics.median(firsts), statistics.median(seconds)
        rows.append((label, first, second, cached))
    print(f"{'':18} {'1st TTFT p50 ms':>16} {'2nd TTFT p50 ms':>16} {'2nd / 1st':>10} {'2nd cached tokens':>18}")
    for label, first, second, cached in rows:
        print(f"{label:18} {first * 1000:16.0f} {second * 1000:16.0f} {second / first:10.3f} {cached:18d}")
    print(f"bar: 2nd / 1st <= 0.25 with the cache; with it, the 2nd request's TTFT is "
          f"{rows[1][2] / rows[0][2]:.1f}x shorter than without")


if __name__ == "__main__":
    main()
