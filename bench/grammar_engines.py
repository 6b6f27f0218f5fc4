"""xgrammar vs llguidance on our tokenizer: compile time and per-token mask time.

    .venv/bin/python bench/grammar_engines.py [--model-dir DIR] [--steps 48]

Compile: 20 varied schemas from the test corpus, each compiled cold (no cache) — for llguidance the
first mask is included, because it builds its lexer lazily on first use. Mask: a constrained random
walk (seeded random logits, masked, argmax) through each grammar; each step times filling the
allowed-token bitmask for every row and advancing every matcher, at batch 1 and 16 (16 rows = 16
different schemas). The batch APIs (xgrammar BatchGrammarMatcher, llguidance LLExecutor) are used at 16.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from testkit.corpora.grammar import SCHEMAS  # noqa: E402

VOCAB = 49152


def default_model_dir() -> str:
    root = os.environ.get("SLUICE_MODEL_CACHE", "/work/main/.data/test-model-cache")
    found = sorted(glob.glob(f"{root}/*/tokenizer.json"))
    if not found:
        sys.exit(f"no cached model under {root}")
    return str(Path(found[0]).parent)


class Xgr:
    name = "xgrammar"

    def __init__(self, tokenizer):
        import xgrammar as xgr
        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB)
        self.batcher = xgr.BatchGrammarMatcher()

    def compile(self, schema: dict):
        compiler = self.xgr.GrammarCompiler(self.info, cache_enabled=False)
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def bitmask(self, rows: int):
        return self.xgr.allocate_token_bitmask(rows, VOCAB)

    def fill(self, matchers, bitmask):
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, 0)
        else:
            self.batcher.batch_fill_next_token_bitmask(matchers, bitmask)

    def apply(self, logits, bitmask):
        self.xgr.apply_token_bitmask_inplace(logits, bitmask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)

    def done(self, matcher) -> bool:
        return matcher.is_terminated()


class Llg:
    name = "llguidance"

    def __init__(self, tokenizer):
        import llguidance
        import llguidance.hf
        import llguidance.torch
        self.llg, self.lt = llguidance, llguidance.torch
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=VOCAB)
        self.executor = llguidance.LLExecutor()

    def compile(self, schema: dict):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), defaults={"whitespace_flexible": False})
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)
        mask = self.lt.allocate_token_bitmask(1, VOCAB)
        self.lt.fill_next_token_bitmask(matcher, mask, 0)  # forces the lazy lexer build
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return grammar

    def matcher(self, compiled):
        return self.llg.LLMatcher(self.tokenizer, compiled)

    def bitmask(self, rows: int):
        return self.lt.allocate_token_bitmask(rows, VOCAB)

    def fill(self, matchers, bitmask):
        if len(matchers) == 1:
            self.lt.fill_next_token_bitmask(matchers[0], bitmask, 0)
        else:
            self.lt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def apply(self, logits, bitmask):
        self.lt.apply_token_bitmask_inplace(logits, bitmask)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)

    def done(self, matcher) -> bool:
        return matcher.is_stopped()


def bench_compile(engine, schemas) -> tuple[list[float], list[object]]:
    times, compiled = [], []
    for _, schema in schemas:
        start = time.perf_counter()
        compiled.append(engine.compile(schema))
        times.append((time.perf_counter() - start) * 1000)
    return times, compiled


def bench_mask(engine, compiled: list, rows: int, steps: int, seed: int = 0) -> list[float]:
    """Per-step milliseconds for `rows` matchers walking `steps` constrained tokens."""
    generator = torch.Generator().manual_seed(seed)
    grammars = [compiled[i % len(compiled)] for i in range(rows)]
    matchers = [engine.matcher(g) for g in grammars]
    bitmask = engine.bitmask(rows)
    times = []
    for _ in range(steps):
        logits = torch.randn(rows, VOCAB, generator=generator)
        start = time.perf_counter()
        engine.fill(matchers, bitmask)
        engine.apply(logits, bitmask)
        tokens = logits.argmax(dim=-1).tolist()
        for matcher, token in zip(matchers, tokens):
            engine.accept(matcher, token)
        times.append((time.perf_counter() - start) * 1000)
        for i, matcher in enumerate(matchers):  # a finished walk starts over, outside the timing
            if engine.done(matcher):
                matchers[i] = engine.matcher(grammars[i])
    return times


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--steps", type=int, default=48)
    args = parser.parse_args()
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir or default_model_dir())
    schemas = SCHEMAS[:20]
    print(f"torch threads {torch.get_num_threads()}, {len(schemas)} schemas, {args.steps} steps per walk")
    print(f"{'engine':<11} {'setup ms':>9} {'compile mean':>12} {'p50':>7} {'max':>7} "
          f"{'mask b1 mean':>12} {'p90':>6} {'mask b16 mean':>13} {'p90':>6} {'per row b16':>11}")
    for cls in (Xgr, Llg):
        start = time.perf_counter()
        engine = cls(tokenizer)
        setup = (time.perf_counter() - start) * 1000
        compile_ms, compiled = bench_compile(engine, schemas)
        b1 = [t for i in range(len(compiled)) for t in bench_mask(engine, compiled[i:i + 1], 1, args.steps, i)]
        b16 = bench_mask(engine, compiled, 16, args.steps * 4)
        print(f"{engine.name:<11} {setup:9.0f} {statistics.mean(compile_ms):12.1f} "
              f"{statistics.median(compile_ms):7.1f} "
              f"{max(compile_ms):7.1f} {statistics.mean(b1):12.3f} {pct(b1, .9):6.3f} {statistics.mean(b16):13.3f} "
              f"{pct(b16, .9):6.3f} {statistics.mean(b16) / 16:11.3f}")


if __name__ == "__main__":
    main()
