"""LoRA throughput: 16 concurrent requests spread over 4 adapters against the same 16 on the base model.

    .venv/bin/python bench/lora.py [--requests 16] [--adapters 4] [--rank 16] [--tokens 128] [--repeats 3]
                                   [--targets all|attention] [--quantization none]

One engine with the worker's default settings for this machine (torch threads and decode row groups
as `python -m worker` picks them), SmolLM2. The adapters are random PEFT adapters written into a
temporary directory, each targeting every projection (the costliest case) unless `--targets
attention`. The base batch and the adapter batch alternate `--repeats` times, so both see the same
machine load; each is the same prompts (64-256 tokens) and `--tokens` new tokens per request
(min_tokens = max_tokens, greedy). Adapters are loaded before the timed runs (the cold load is timed
on its own). Prints tok/s (generated tokens / wall time, prefill included), decode tok/s (rows /
mean gap between tokens) and the adapter/base ratio of each pair. The issue's target: >= 0.70.
`--quick` (or SLUICE_BENCH_QUICK=1) runs a small version for `make bench`.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout, not an installed copy

from tests.worker.lora.adapters import ATTENTION, EVERY, write_adapter  # noqa: E402
from worker.engine.engine import Engine  # noqa: E402
from worker.loading import load_model  # noqa: E402
from common.protocol import AdapterRef, Done, Error, GenerateRequest, ModelConfig, SamplingParams, Token  # noqa: E402
from worker.threads import decode_threads, torch_threads  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TEXT = ("The history of the river town begins with a ferry crossing, a mill and a handful of farms. "
        "Merchants came for the grain, stayed for the trade, and built warehouses along the quay. "
        "def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), value.strip()\n"
        "Dear team, the quarterly report is attached; revenue grew while costs stayed flat. ")


def prompts(tokenizer, count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    corpus = tokenizer(TEXT * 12).input_ids
    out = []
    for _ in range(count):
        length = rng.randint(64, 256)
        start = rng.randint(0, len(corpus) - length)
        out.append(corpus[start:start + length])
    return out


def run(engine: Engine, requests: list[tuple[list[int], AdapterRef | None]], tokens: int) -> tuple[float, float]:
    """(tok/s, decode tok/s) of the requests submitted at once."""
    gaps: list[float] = []
    generated = [0]
    remaining = [len(requests)]
    ended, lock = threading.Event(), threading.Lock()

    def sink_for():
        last = [None]

        def sink(events):
            now = time.perf_counter()
            for event in events:
                if isinstance(event, Error):
                    raise SystemExit(f"request failed: {event}")
                if isinstance(event, Token):
                    if last[0] is not None:
                        gaps.append(now - last[0])
                    last[0] = now
                    generated[0] += 1
                if isinstance(event, Done):
                    with lock:
                        remaining[0] -= 1
                        if remaining[0] == 0:
                            ended.set()
        return sink

    prepared = [engine.prepare(GenerateRequest(request_id=uuid.uuid4().hex, model="bench", prompt_ids=ids,
                                               params=SamplingParams(max_tokens=tokens, min_tokens=tokens,
                                                                     temperature=0.0), adapter=adapter))
                for ids, adapter in requests]
    start = time.perf_counter()
    for item in prepared:
        engine.submit(item, sink_for())
    ended.wait()
    return generated[0] / (time.perf_counter() - start), len(requests) / statistics.fmean(gaps or [float("nan")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--targets", choices=["all", "attention"], default="all")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("SLUICE_BENCH_QUICK")),
                        help="32 tokens, one repeat (make bench)")
    args = parser.parse_args()
    if args.quick:
        args.tokens, args.repeats = 32, 1

    config = ModelConfig(quantization=args.quantization)
    torch.set_num_threads(torch_threads(config))
    os.environ.setdefault("SLUICE_MODEL_CACHE", str(REPO / ".data" / "test-model-cache"))
    loaded = load_model(config, REPO / ".bench" / "lora")
    with tempfile.TemporaryDirectory(prefix="sluice-bench-lora-") as adapters_dir:
        bench(args, config, loaded, Path(adapters_dir))


def bench(args, config: ModelConfig, loaded, data_dir: Path) -> None:
    targets = EVERY if args.targets == "all" else ATTENTION
    refs = [AdapterRef(name=f"adapter-{i}", source=str(write_adapter(loaded.model, data_dir / f"adapter-{i}", i,
                                                                         targets, rank=args.rank, alpha=args.rank,
                                                                         strength=0.05)))
            for i in range(args.adapters)]
    engine = Engine(loaded, config, "bench-lora", data_dir=data_dir)
    engine.start()
    try:
        print(f"SmolLM2 {loaded.quantization} / {loaded.dtype}, torch threads {torch.get_num_threads()}, decode "
              f"row groups up to {decode_threads(config)}; {args.requests} requests x {args.tokens} tokens; "
              f"{args.adapters} adapters of rank {args.rank} on {args.targets} projections")
        started = time.perf_counter()
        run(engine, [(prompts(loaded.tokenizer, 1)[0], ref) for ref in refs], 1)  # cold loads, then resident
        print(f"cold load and one token for each of {len(refs)} adapters: {time.perf_counter() - started:.2f} s")
        ids = prompts(loaded.tokenizer, args.requests)
        base = [(p, None) for p in ids]
        adapted = [(p, refs[i % len(refs)]) for i, p in enumerate(ids)]
        run(engine, base[:2], 4)  # warm-up
        ratios = []
        print(f"{'run':<6}{'base tok/s':>12}{'lora tok/s':>12}{'ratio':>8}{'base decode':>13}{'lora decode':>13}"
              f"{'ratio':>8}")
        for repeat in range(args.repeats):
            base_rate, base_decode = run(engine, base, args.tokens)
            lora_rate, lora_decode = run(engine, adapted, args.tokens)
            ratios.append((lora_rate / base_rate, lora_decode / base_decode))
            print(f"{repeat + 1:<6}{base_rate:12.1f}{lora_rate:12.1f}{ratios[-1][0]:8.2f}{base_decode:13.1f}"
                  f"{lora_decode:13.1f}{ratios[-1][1]:8.2f}")
        overall, decode = [r[0] for r in ratios], [r[1] for r in ratios]
        print(f"lora / base tok/s: median {statistics.median(overall):.2f} (min {min(overall):.2f}, max "
              f"{max(overall):.2f}); decode: median {statistics.median(decode):.2f} (min {min(decode):.2f}, max "
              f"{max(decode):.2f}); target >= 0.70")
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
