"""LoRA throughput: 16 concurrent requests spread over 4 adapters against the same 16 on the base model.

    .venv/bin/python bench/lora.py [--requests 16] [--adapters 4] [--rank 16] [--targets all|attention]
                                   [--tokens 128] [--repeats 3] [--quantization none] [--quick]

One engine with the worker's default settings for this machine (torch threads and decode row groups
as `python -m worker` picks them), SmolLM2. The adapters are random PEFT adapters written into a
temporary directory, each targeting every projection (the costliest case) unless `--targets
attention`. The base batch and the adapter batch alternate `--repeats` times, so both see the same
machine load; both are the same requests as bench/worker.py's (prompts of 64-256 tokens, `--tokens`
new tokens each with min_tokens = max_tokens, a mix of greedy, sampled and penalised settings), the
adapter batch with request i on adapter i mod 4. Adapters are loaded before the timed runs (the cold
load is timed on its own). Prints tok/s (generated tokens / wall time, prefill included), decode
tok/s (rows / mean gap between tokens) and the adapter/base ratio of each pair, then the median and
spread of the ratios. The target: >= 0.70. `--quick` (or SLUICE_BENCH_QUICK=1) runs a small
version for `make bench`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

# this checkout first; and this file's folder off sys.path, where bench/worker.py would shadow the package
sys.path[:] = [str(Path(__file__).resolve().parents[1])] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from bench.worker import make_requests, run_engine  # noqa: E402
from common.protocol import AdapterRef, ModelConfig  # noqa: E402
from testkit.lora_adapters import ATTENTION, EVERY, write_adapter  # noqa: E402
from worker.engine.engine import Engine  # noqa: E402
from worker.loading import load_model  # noqa: E402
from worker.threads import decode_threads, torch_threads  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


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
    requests = make_requests(loaded.tokenizer, args.requests, args.tokens)
    adapters = [refs[i % len(refs)] for i in range(args.requests)]
    engine = Engine(loaded, config, "bench-lora", data_dir=data_dir)
    engine.start()
    try:
        print(f"SmolLM2 {loaded.quantization} / {loaded.dtype}, torch threads {torch.get_num_threads()}, decode "
              f"row groups up to {decode_threads(config)}; {args.requests} requests x {args.tokens} tokens; "
              f"{args.adapters} adapters of rank {args.rank} on {args.targets} projections")
        started = time.perf_counter()
        run_engine(engine, requests[:len(refs)], 2, refs)  # each adapter's cold load, then it is resident
        print(f"{len(refs)} cold adapter loads and 2 tokens each: {time.perf_counter() - started:.2f} s")
        ratios = []
        print(f"{'run':<6}{'base tok/s':>12}{'lora tok/s':>12}{'ratio':>8}{'base decode':>13}{'lora decode':>13}"
              f"{'ratio':>8}")
        for repeat in range(args.repeats):
            base = run_engine(engine, requests, args.tokens)
            lora = run_engine(engine, requests, args.tokens, adapters)
            rates = (base.tokens / base.wall, lora.tokens / lora.wall, base.decode_rate(), lora.decode_rate())
            ratios.append((rates[1] / rates[0], rates[3] / rates[2]))
            print(f"{repeat + 1:<6}{rates[0]:12.1f}{rates[1]:12.1f}{ratios[-1][0]:8.2f}{rates[2]:13.1f}"
                  f"{rates[3]:13.1f}{ratios[-1][1]:8.2f}")
        for label, values in (("tok/s", [r[0] for r in ratios]), ("decode tok/s", [r[1] for r in ratios])):
            print(f"lora / base {label}: median {statistics.median(values):.2f} (min {min(values):.2f}, "
                  f"max {max(values):.2f}); target >= 0.70")
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
