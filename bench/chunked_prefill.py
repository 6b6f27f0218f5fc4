"""Chunked prefill: running streams' inter-token latency while a long prompt joins the batch, same run.

    .venv/bin/python bench/chunked_prefill.py [--quick] [--streams 15] [--prompt-tokens 2048]
                                              [--budgets 512,64] [--quantization auto] [--dtype auto]

One Engine per `max_batched_tokens` budget (in-process, as bench/worker.py drives it), SmolLM2-135M in the
worker's default configuration unless --quantization / --dtype say otherwise.
`--streams` greedy requests decode (ignore_eos); once all of them stream, we take their inter-token gaps for
a while undisturbed (the peer figure), then submit one `--prompt-tokens`-token prompt and take the gaps from
its submission until its prefill ends (its `Accepted`). The streams decode between the prompt's chunks; a chunk
is at most `max_batched_tokens` and, while rows decode, about what a decode step costs as measured
(worker/engine/prefill_pace.py), so past a few dozen tokens the budget no longer sets the stall: prints each
budget's undisturbed and disturbed ITL p50 / p99, the ratio of the p99s and the prompt's engine steps. No
assertions; the bar: disturbed p99 within 2x of undisturbed. `--quick` (or SLUICE_BENCH_QUICK=1) takes fewer
undisturbed steps.
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

# run as a script, this file's folder comes first on sys.path and bench/worker.py would shadow the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: bench.harness beside the packages

from bench.harness.stats import percentile
from common.protocol import Accepted, GenerateRequest, ModelConfig, SamplingParams, Token
from worker.engine.engine import Engine
from worker.loading import load_model

REPO = Path(__file__).resolve().parents[1]


class Streams:
    """Token arrival times of the running streams, by stream."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.times: dict[str, list[float]] = {}

    def sink(self, request_id: str):
        self.times[request_id] = []

        def take(events) -> None:
            now = time.perf_counter()
            if any(isinstance(e, Token) for e in events):
                with self.lock:
                    self.times[request_id].append(now)
        return take

    def gaps(self, start: float, end: float) -> list[float]:
        """Gaps between consecutive tokens of a stream that end inside [start, end)."""
        with self.lock:
            return [b - a for times in self.times.values() for a, b in zip(times, times[1:]) if start <= b < end]

    def least(self) -> int:
        with self.lock:
            return min(len(times) for times in self.times.values())


def measure(loaded, args, budget: int, undisturbed_steps: int) -> tuple[list[float], list[float], int]:
    """The streams' gaps undisturbed and during the long prompt's prefill, and the engine steps it took."""
    context = args.prompt_tokens + 256
    engine = Engine(loaded, ModelConfig(dtype=args.dtype, quantization=args.quantization,
                                        max_batch_size=args.streams + 1, max_context=context,
                                        max_batched_tokens=budget))
    engine.start()
    engine.warm_up()
    streams = Streams()
    try:
        for index in range(args.streams):
            request_id = f"stream-{index}"
            request = GenerateRequest(request_id=request_id, model="m", prompt=f"Tell a long story about lake {index}.",
                                      params=SamplingParams(max_tokens=context - 64, temperature=0.0, ignore_eos=True))
            engine.submit(engine.prepare(request), streams.sink(request_id))
        while streams.least() < 3:  # every stream decodes
            time.sleep(0.01)
        started, steps = time.perf_counter(), engine.steps
        while engine.steps < steps + undisturbed_steps:
            time.sleep(0.01)
        calm_end, calm_steps = time.perf_counter(), engine.steps
        accepted = threading.Event()
        ids = loaded.tokenizer("The river ran on and on. " * args.prompt_tokens).input_ids[: args.prompt_tokens]
        long = GenerateRequest(request_id="long", model="m", prompt_ids=ids,
                               params=SamplingParams(max_tokens=1, temperature=0.0))
        engine.submit(engine.prepare(long), lambda events: any(isinstance(e, Accepted) for e in events)
                      and accepted.set())
        if not accepted.wait(1800):
            raise TimeoutError("the long prompt was not prefilled in 30 minutes")
        return streams.gaps(started, calm_end), streams.gaps(calm_end, time.perf_counter()), engine.steps - calm_steps
    finally:
        for request_id in list(engine.by_id):
            engine.cancel(request_id)
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", default=os.environ.get("SLUICE_BENCH_QUICK") == "1")
    parser.add_argument("--streams", type=int, default=15)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--budgets", default="512,64", help="max_batched_tokens values, comma-separated")
    parser.add_argument("--quantization", default="auto", help="as the worker's model config (auto: its default)")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    undisturbed_steps = 10 if args.quick else 40

    os.environ.setdefault("SLUICE_MODEL_CACHE", str(REPO / ".data" / "test-model-cache"))
    torch.set_num_threads(1)
    loaded = load_model(ModelConfig(dtype=args.dtype, quantization=args.quantization), REPO / ".bench" / "worker")
    print(f"SmolLM2-135M {loaded.quantization} {loaded.model.dtype}: {args.streams} greedy streams decoding, then "
          f"one {args.prompt_tokens}-token prompt arrives; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    print(f"\n{'max_batched_tokens':>18} {'undisturbed p50 / p99 ms':>25} {'during prefill p50 / p99 ms':>28} "
          f"{'p99 ratio':>10} {'prefill steps':>14}")
    for budget in [int(b) for b in args.budgets.split(",")]:
        calm, disturbed, steps = measure(loaded, args, budget, undisturbed_steps)
        calm_p99, disturbed_p99 = percentile(calm, 0.99), percentile(disturbed, 0.99)
        print(f"{budget:>18} {statistics.median(calm) * 1000:>12.0f} / {calm_p99 * 1000:>7.0f}   "
              f"{statistics.median(disturbed) * 1000:>14.0f} / {disturbed_p99 * 1000:>7.0f}   "
              f"{disturbed_p99 / calm_p99:>9.2f}x {steps:>14}   (load {os.getloadavg()[0]:.1f})", flush=True)
    print("\nbar: p99 during the prefill within 2x of the undisturbed p99.")


if __name__ == "__main__":
    main()
