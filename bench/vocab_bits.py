"""The vocabulary matrix's width in q4 (a family's `vocab_bits`) on a real model: float32, then q4 with the
vocabulary packed in 8 bits and in 4, on the same weights, by the quality rule of `quantization = "auto"`.

    .venv/bin/python bench/vocab_bits.py [--model gemma3|smol] [--prompts 8] [--tokens 32] [--text-tokens 1024]
        [--threads 1] [--modes 8,4]

Per width: teacher-forced top-1 over float32's greedy continuations of `--prompts` chat prompts
(testkit/corpora/tools.py), the perplexity ratio to float32's on docs/security.md (its first `--text-tokens`
tokens), how many leading greedy tokens of each continuation equal float32's (free running, q4's own decode),
and one stream's median decode step. Gemma 3 270M's 262,144 x 640 vocabulary is 168 M of its 268 M parameters:
8 bits read 189 MB a token, 4 bits 105 MB. No assertions.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import gc
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bench.default_config import PERPLEXITY_TEXT, perplexity, top1_agreement
from bench.q4_vs_w8a8 import MODELS, greedy
from common.protocol import ModelConfig
from testkit.corpora.tools import PROMPTS
from testkit.quality_rule import MAX_PERPLEXITY_RATIO, MIN_TOP1
from worker.engine.native.install import install_native
from worker.engine.native.model import KV_DTYPE
from worker.engine.native.pack import pack_fixed
from worker.engine.native.packed_torch import PackedEmbedding
from worker.engine.runner import ModelRunner
from worker.loading import load_model

CONTEXT = 1100


def chat(tokenizer, model: str, text: str) -> list[int]:
    """`text` as a user turn in the model's own format (q4_vs_w8a8's prompt with the question swapped)."""
    template = MODELS[model][2].replace("Write a short story about a lighthouse keeper.", text)
    return tokenizer(template).input_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gemma3")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--text-tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", default="8,4", help="8, 4 and 4+8 (the head in 4 bits, the embedding in 8)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    name, source, _ = MODELS[args.model]
    loaded = load_model(ModelConfig(name=name, source=source, quantization="none", dtype="float32",
                                    max_context=CONTEXT), Path(tempfile.mkdtemp(prefix="vocab-bits-")))
    prompts = [chat(loaded.tokenizer, args.model, text) for text in PROMPTS[:args.prompts]]
    text = loaded.tokenizer(PERPLEXITY_TEXT.read_text()).input_ids[:args.text_tokens]
    reference = ModelRunner(loaded.model, 1, CONTEXT)
    references = [greedy(reference, prompt, args.tokens)[0] for prompt in prompts]
    base = perplexity(reference, text)
    del reference
    print(f"{args.model}: float32 perplexity {base:.3f} on {len(text)} tokens; {len(prompts)} prompts x "
          f"{args.tokens} greedy tokens; rule: top-1 >= {MIN_TOP1}, perplexity <= {MAX_PERPLEXITY_RATIO}x")
    modes = {"8": (8, "vocabulary 8-bit"), "4": (4, "vocabulary 4-bit"), "4+8": (4, "head 4-bit, embedding 8-bit")}
    for bits, label in (modes[mode] for mode in args.modes.split(",")):
        runner = ModelRunner(copy.deepcopy(loaded.model), 1, CONTEXT, kv_dtype=KV_DTYPE)
        runner.family = dataclasses.replace(runner.family, vocab_bits=bits)
        install_native(runner, args.threads, release=True)
        if "embedding 8" in label:
            eight = pack_fixed(loaded.model.get_input_embeddings().weight, 8)
            runner.embed_tokens = PackedEmbedding(eight, runner.embed_tokens.scale)
        top1 = top1_agreement(runner, prompts, references)
        ratio = perplexity(runner, text) / base
        runs = [greedy(runner, prompt, args.tokens) for prompt in prompts]
        leading = [next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
                   for (got, _), want in zip(runs, references)]
        step = statistics.median(s for _, steps in runs for s in steps[4:])
        keeps = "keeps" if top1 >= MIN_TOP1 and ratio <= MAX_PERPLEXITY_RATIO else "breaks"
        print(f"q4, {label}: top-1 {top1:.3f}, perplexity {ratio:.4f}x ({keeps} the rule); greedy "
              f"equal to float32 for {sum(leading)} of {len(prompts) * args.tokens} leading tokens "
              f"({sum(n == args.tokens for n in leading)} of {len(prompts)} continuations whole); "
              f"decode step {step * 1000:.1f} ms ({1 / step:.1f} tok/s)", flush=True)
        del runner
        gc.collect()


if __name__ == "__main__":
    main()
