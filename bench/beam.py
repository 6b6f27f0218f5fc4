"""Beam search inside the batch, against transformers' `generate(num_beams=4)` one request at a time.

    .venv/bin/python bench/beam.py [--requests 8] [--tokens 128] [--baseline-requests 8]

1. Throughput: `--requests` concurrent num_beams=4 requests of `--tokens` new tokens through our engine,
   against the same requests through transformers `generate` one after another (same process, same
   weights, same thread count). `min_tokens = max_tokens` so both run every step.
2. Sharing: ordinary greedy requests alone, then the same requests while the beam requests run; the
   figure is the share of their no-beam throughput they keep.
Prints numbers only (no assertions); the targets are >= 4x and >= 70%.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path

import torch

# run as a script, this file's folder comes first on sys.path and bench/worker.py would shadow the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from common.protocol import Done, Error, GenerateRequest, ModelConfig, SamplingParams
from worker.engine.engine import Engine
from worker.loading import load_model

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["The capital of France is", "Once upon a time, in a small village,", "def fibonacci(n):",
           "The three primary colors are", "Water boils at", "My favourite recipe for pancakes",
           "In 1969, astronauts", "The best way to learn a language is", "Dear customer, we are sorry",
           "List of planets: Mercury, Venus,", "Photosynthesis converts", "Step 1: preheat the oven"]


def run_engine(engine: Engine, requests: list[GenerateRequest]) -> tuple[float, list[float]]:
    """Submit all at once; wall time of the whole set and the finishing time of each request."""
    ended = [threading.Event() for _ in requests]
    finished_at = [0.0] * len(requests)

    def sink_for(i):
        def sink(events):
            if any(isinstance(e, Error) for e in events):
                raise SystemExit(f"request failed: {events}")
            if any(isinstance(e, Done) for e in events):
                finished_at[i] = time.perf_counter()
                ended[i].set()
        return sink

    prepared = [engine.prepare(r) for r in requests]
    start = time.perf_counter()
    for i, item in enumerate(prepared):
        engine.submit(item, sink_for(i))
    for event in ended:
        event.wait()
    return time.perf_counter() - start, [t - start for t in finished_at]


def generate_request(ids: list[int], **params) -> GenerateRequest:
    return GenerateRequest(request_id=uuid.uuid4().hex, model="bench", prompt_ids=ids, params=SamplingParams(**params))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--baseline-requests", type=int, default=8, help="transformers runs (sequential)")
    parser.add_argument("--ordinary", type=int, default=8, help="greedy requests for the sharing figure")
    args = parser.parse_args()
    os.environ.setdefault("SLUICE_MODEL_CACHE", str(REPO / ".data" / "test-model-cache"))
    torch.set_num_threads(int(os.environ.get("SLUICE_TORCH_THREADS", torch.get_num_threads())))
    loaded = load_model(ModelConfig(), REPO / ".bench" / "beam")
    tokenizer, model = loaded.tokenizer, loaded.model
    prompts = [tokenizer(PROMPTS[i % len(PROMPTS)]).input_ids for i in range(args.requests + args.ordinary)]
    beams = dict(num_beams=4, max_tokens=args.tokens, min_tokens=args.tokens)
    engine = Engine(loaded, ModelConfig(max_batch_size=4 * args.requests + args.ordinary, max_context=1024))
    engine.start()
    try:
        run_engine(engine, [generate_request(prompts[0], num_beams=4, max_tokens=4)])  # warm-up
        ours, _ = run_engine(engine, [generate_request(ids, **beams) for ids in prompts[: args.requests]])
        new_tokens = args.requests * args.tokens
        print(f"engine: {args.requests} x num_beams=4 x {args.tokens} tokens concurrently: {ours:.1f} s, "
              f"{new_tokens / ours:.1f} returned tok/s")

        baseline = 0.0
        for ids in prompts[: args.baseline_requests]:
            start = time.perf_counter()
            with torch.inference_mode():
                model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                               num_beams=4, do_sample=False, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                               pad_token_id=tokenizer.eos_token_id)
            baseline += time.perf_counter() - start
        per_request = baseline / args.baseline_requests
        print(f"transformers generate(num_beams=4), one at a time: {per_request:.1f} s per request, "
              f"{args.tokens / per_request:.1f} returned tok/s (measured on {args.baseline_requests})")
        print(f"beam throughput ratio (engine / transformers): {per_request * args.requests / ours:.2f}x  "
              f"(target >= 4x)")

        greedy = dict(max_tokens=args.tokens, min_tokens=args.tokens, temperature=0.0)
        ordinary = [generate_request(ids, **greedy) for ids in prompts[args.requests:]]
        alone, _ = run_engine(engine, ordinary)
        mixed = [generate_request(ids, **beams) for ids in prompts[: args.requests]]
        mixed += [generate_request(ids, **greedy) for ids in prompts[args.requests:]]
        _, finished = run_engine(engine, mixed)
        shared = max(finished[args.requests:])
        tokens = args.ordinary * args.tokens
        print(f"ordinary greedy requests ({args.ordinary} x {args.tokens} tokens): alone {tokens / alone:.1f} tok/s, "
              f"beside the beam requests {tokens / shared:.1f} tok/s -> keep {100 * alone / shared:.0f}% "
              f"(target >= 70%)")
        beams_done = max(finished[: args.requests])
        print(f"beam requests meanwhile: {new_tokens / beams_done:.1f} returned tok/s (alone {new_tokens / ours:.1f}); "
              f"they sit out steps while ordinary rows run (ordinary_share_beside_beams)")
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
