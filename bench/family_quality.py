"""The quality rule of `quantization = "auto"` (bench/default_config.py: top-1 >= 0.90, perplexity <= 1.05x float32)
per decoder family, on the tiny random models of testkit/tiny_families.py: for each family, which quantized modes
its model runs and how close each comes to float32 on the same weights.

    .venv/bin/python bench/family_quality.py [--sequences 8] [--tokens 32] [--family gemma3_text ...]

Per family and mode: top-1 = the share of positions of float32's own greedy continuations (teacher-forced) where
the mode's argmax is float32's token; perplexity = the ratio of the mode's perplexity on those sequences to
float32's. A random model's logits are nearly flat, so its vocabulary projection is sharpened (as
tests/worker/beam/tiny.py does) to give the argmax a margin a real model has. Modes a family cannot run print
the reason. No assertions.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from testkit.quality_rule import MAX_PERPLEXITY_RATIO, MIN_TOP1
from testkit.tiny_families import FAMILIES, VOCAB, tiny_family
from worker.engine.native.install import install_native
from worker.engine.runner import ModelRunner
from worker.engine.w8a8 import quantize_runner
from worker.loading import LoadedModel


def _runner(loaded: LoadedModel, mode: str, context: int) -> ModelRunner:
    model = copy.deepcopy(loaded.model)
    if mode == "q4":
        from worker.engine.native.model import KV_DTYPE
        runner = ModelRunner(model, 1, context, kv_dtype=KV_DTYPE)
        install_native(runner)
        return runner
    runner = ModelRunner(model, 1, context)
    if mode == "w8a8":
        quantize_runner(runner, loaded.tokenizer)
    return runner


def _scores(runner: ModelRunner, sequence: list[int]) -> torch.Tensor:
    """Log-probabilities at every position but the last (next-token predictions), teacher-forced."""
    return runner.prefill(0, sequence[:-1], all_logits=True).logits.log_softmax(-1)


def measure(name: str, sequences: int, tokens: int) -> list[str]:
    loaded = tiny_family(name)
    with torch.no_grad():
        loaded.model.get_output_embeddings().weight.mul_(4.0)
    generator = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, VOCAB, (16,), generator=generator).tolist() for _ in range(sequences)]
    with torch.inference_mode():
        texts = [loaded.model.generate(torch.tensor([p]), max_new_tokens=tokens, min_new_tokens=tokens,
                                       do_sample=False)[0].tolist() for p in prompts]
    reference = _runner(loaded, "none", 128)
    rows = []
    base = [_scores(reference, text) for text in texts]
    for mode in ("w8a8", "q4"):
        try:
            runner = _runner(loaded, mode, 128)
        except Exception as error:  # the reason the mode refuses this family
            rows.append(f"| {name} | {mode} | - | - | refused: {' '.join(str(error).split())[:110]} |")
            continue
        agree = total = 0
        nll_base = nll = 0.0
        for text, expected in zip(texts, base):
            got = _scores(runner, text)
            targets = torch.tensor(text[1:])
            continuation = slice(len(text) - 1 - tokens, None)
            agree += int((got[continuation].argmax(-1) == targets[continuation]).sum())
            total += tokens
            nll_base -= float(expected.gather(1, targets[:, None]).sum())
            nll -= float(got.gather(1, targets[:, None]).sum())
        positions = sum(len(t) - 1 for t in texts)
        top1, ratio = agree / total, math.exp((nll - nll_base) / positions)
        keeps = "yes" if top1 >= MIN_TOP1 and ratio <= MAX_PERPLEXITY_RATIO else "no"
        rows.append(f"| {name} | {mode} | {top1:.3f} | {ratio:.4f}x | {keeps} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--family", action="append", choices=sorted(FAMILIES), help="only these (default: all)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| family | mode | top-1 | perplexity vs float32 | keeps quality |\n|---|---|---|---|---|")
    for name in sorted(args.family or FAMILIES):
        for row in measure(name, args.sequences, args.tokens):
            print(row, flush=True)


if __name__ == "__main__":
    main()
