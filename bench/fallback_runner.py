"""What transformers' forward inside the engine (worker/engine/hf_runner.py) costs against the lean runner, on
the same model in the same run: SmolLM2-135M in float32, taken off the fast path's list for the fallback's turn,
and transformers `generate()` one request at a time as the peer.

    .venv/bin/python bench/fallback_runner.py [--concurrency 1,8] [--tokens 32]

Prints decode tok/s for each and the ratios. No assertions: the fallback is the "runs at all" path, and its
price is the point (rows of unequal length take a forward each).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import torch

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from common.protocol import Done, Error, GenerateRequest, ModelConfig, SamplingParams
from worker.engine import runner_choice
from worker.engine.engine import Engine
from worker.loading import load_model

PROMPTS = ["The history of the river town begins with a ferry crossing", "def parse(line):",
           "Dear team, the quarterly report is attached;", "Merchants came for the grain, stayed for the trade"]


def engine_tok_s(loaded, concurrency: int, tokens: int) -> float:
    config = ModelConfig(quantization="none", dtype="float32", max_batch_size=max(concurrency, 4), max_context=512)
    engine = Engine(loaded, config, "bench")
    engine.start()
    try:
        left, finished = [concurrency], threading.Event()

        def sink(batch):
            if any(isinstance(event, (Done, Error)) for event in batch):
                left[0] -= 1
                if not left[0]:
                    finished.set()

        started = time.perf_counter()
        for index in range(concurrency):
            request = GenerateRequest(request_id=f"r{index}", model="m", prompt=PROMPTS[index % len(PROMPTS)],
                                      params=SamplingParams(max_tokens=tokens, min_tokens=tokens, temperature=0))
            engine.submit(engine.prepare(request), sink)
        finished.wait()
        return concurrency * tokens / (time.perf_counter() - started)
    finally:
        engine.stop()


def generate_tok_s(loaded, tokens: int) -> float:
    ids = loaded.tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    started = time.perf_counter()
    with torch.inference_mode():
        loaded.model.generate(ids, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False)
    return tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded = load_model(ModelConfig(quantization="none", dtype="float32"), Path(".data"))
    peer = generate_tok_s(loaded, args.tokens)
    print(f"transformers generate(), 1 request: {peer:.1f} tok/s")
    lean_types = runner_choice.LEAN_MODEL_TYPES
    for concurrency in [int(c) for c in args.concurrency.split(",")]:
        lean = engine_tok_s(loaded, concurrency, args.tokens)
        runner_choice.LEAN_MODEL_TYPES = frozenset()  # the same model through transformers' forward
        try:
            fallback = engine_tok_s(loaded, concurrency, args.tokens)
        finally:
            runner_choice.LEAN_MODEL_TYPES = lean_types
        print(f"{concurrency} concurrent: lean {lean:.1f} tok/s, fallback {fallback:.1f} tok/s "
              f"(fallback/lean {fallback / lean:.2f}x, fallback/generate {fallback / peer:.2f}x)")


if __name__ == "__main__":
    main()
