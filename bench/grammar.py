"""Cost of structured output in the real engine: tokens/s with a JSON schema vs the same requests unconstrained.

    .venv/bin/python bench/grammar.py [--tokens 128] [--repeat 2]

Both arms run in the same process on the same engine, alternating, at batch 1 and 16 (16 concurrent
requests, sampled with fixed seeds). The schema asks for a long array, so every constrained row runs to
max_tokens like the unconstrained rows (ignore_eos): both arms generate the same number of tokens.
Then compile times of the test corpus: cold (first compile) and cached (same schema again).
Prints numbers; no assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("SLUICE_MODEL_CACHE", str(Path(__file__).resolve().parents[1] / ".data" / "test-model-cache"))

from common.protocol import Constraint, Done, Error, GenerateRequest, ModelConfig, SamplingParams  # noqa: E402
from testkit.corpora.grammar import REGEXES, SCHEMAS  # noqa: E402
from worker.decoding.grammar import GrammarCompiler  # noqa: E402
from worker.engine.engine import Engine  # noqa: E402
from worker.loading import load_model  # noqa: E402

LONG = {"type": "array", "minItems": 200, "items": {
    "type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
                                     "city": {"type": "string", "maxLength": 12}},
    "required": ["name", "age", "city"], "additionalProperties": False}}
PROMPT = [{"role": "user", "content": "List many people as JSON objects with name, age and city."}]


def run_batch(engine: Engine, rows: int, tokens: int, constrained: bool, tag: str) -> tuple[float, int]:
    """Seconds from submit to the last Done, and tokens generated, for `rows` concurrent requests."""
    remaining = threading.Semaphore(0)
    counted = []

    def sink(events):
        for event in events:
            if isinstance(event, Error):
                raise SystemExit(f"engine error: {event.message}")
            if isinstance(event, Done):
                counted.append(event.completion_tokens)
                remaining.release()

    constraint = Constraint("json_schema", json.dumps(LONG)) if constrained else None
    prepared = [engine.prepare(GenerateRequest(
        request_id=f"{tag}-{i}", model="m", messages=PROMPT,
        params=SamplingParams(temperature=0.8, seed=[i], max_tokens=tokens, ignore_eos=not constrained,
                              constraint=constraint))) for i in range(rows)]
    start = time.perf_counter()
    for p in prepared:
        engine.submit(p, sink)
    for _ in range(rows):
        remaining.acquire()
    return time.perf_counter() - start, sum(counted)


def bench_throughput(engine: Engine, tokens: int, repeat: int) -> None:
    print(f"\nthroughput: {tokens} new tokens per row, best of {repeat}, arms alternating")
    print(f"{'batch':>5} {'unconstrained tok/s':>20} {'json-schema tok/s':>18} {'slowdown':>9}")
    run_batch(engine, 2, 8, True, "warm")  # compile + warm the kernels outside the timing
    for rows in (1, 16):
        plain, constrained = [], []
        for r in range(repeat):
            seconds, count = run_batch(engine, rows, tokens, False, f"p{rows}-{r}")
            plain.append(count / seconds)
            seconds, count = run_batch(engine, rows, tokens, True, f"c{rows}-{r}")
            constrained.append(count / seconds)
        best_plain, best_constrained = max(plain), max(constrained)
        print(f"{rows:>5} {best_plain:>20.1f} {best_constrained:>18.1f} {1 - best_constrained / best_plain:>8.1%}")


def bench_compile(tokenizer, vocab: int, eos: list[int]) -> None:
    compiler = GrammarCompiler(tokenizer, vocab, eos)
    cold, warm = [], []
    constraints = [Constraint("json_schema", json.dumps(s)) for _, s in SCHEMAS]
    constraints += [Constraint("regex", p) for _, p in REGEXES]
    for constraint in constraints:
        start = time.perf_counter()
        compiler.compile(constraint)
        cold.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        compiler.compile(constraint)
        warm.append((time.perf_counter() - start) * 1000)
    print(f"\ncompile ({len(constraints)} corpus constraints), ms:")
    print(f"  cold   mean {statistics.mean(cold):7.2f}  median {statistics.median(cold):7.2f}  max {max(cold):7.2f}")
    print(f"  cached mean {statistics.mean(warm):7.3f}  median {statistics.median(warm):7.3f}  max {max(warm):7.3f}")
    compiler.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    loaded = load_model(ModelConfig(), Path(tempfile.mkdtemp(prefix="sluice-bench-")))
    engine = Engine(loaded, ModelConfig(max_batch_size=16, max_context=512))
    engine.start()
    try:
        bench_compile(engine.tokenizer, engine.vocab_size, engine.model_eos)
        bench_throughput(engine, args.tokens, args.repeat)
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
