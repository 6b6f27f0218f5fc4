"""The worker engine against transformers `generate()` and llama.cpp, each one request at a time, same run.

    .venv/bin/python bench/worker.py [--quick] [--concurrency 1,4,16,64] [--tokens 128]
                                     [--baseline-requests 4] [--threads N] [--peer-threads 1,2]
                                     [--dtype float32] [--quantization none,w8a8] [--device auto]

Our engine is driven in-process (Engine.submit with a sink) with 1, 4, 16 and 64 requests submitted
at once: prompts of 64-256 tokens, `--tokens` new tokens each (min_tokens = max_tokens), a mix of
greedy, temperature/top-p and penalised settings. It uses every core: `--threads` torch threads per
decode row group, as many groups as the cores hold. The peers run the same requests sequentially,
at each of `--peer-threads` thread counts: transformers `generate()` on the same weights in this
process, llama.cpp (llama-cpp-python, built into .bench/llamacpp on first use) on the same GGUF file
in a subprocess. Prints tok/s, time to first token, inter-token latency (p50/p99), peak RSS and the
ratios against each peer at its fastest thread count. No assertions; the targets: at 16
concurrent >= 10x transformers and >= 2x llama.cpp, at 1 request >= transformers. `--quick` (or
SLUICE_BENCH_QUICK=1) runs a small version for `make bench`. On a CUDA device (`--device cuda`, or `auto`
where one is present) measure `--dtype bfloat16 --quantization none,nf4,int8 --no-llamacpp`: each
bitsandbytes mode is loaded as its own model, and the transformers peer runs the unquantized weights.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import torch

# run as a script, this file's folder comes first on sys.path and its name would shadow the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from common.protocol import (
    Done,
    Error,
    GenerateRequest,
    ModelConfig,
    SamplingParams,
    Token,
)
from worker.engine.engine import Engine
from worker.loading import default_gguf_path, load_model
from worker.threads import decode_threads, intra_op_threads

REPO = Path(__file__).resolve().parents[1]
BITSANDBYTES = ("nf4", "fp4", "int8")  # quantized at load time: each mode is a model of its own
LLAMACPP = REPO / ".bench" / "llamacpp"
TEXT = ("The history of the river town begins with a ferry crossing, a mill and a handful of farms. "
        "Merchants came for the grain, stayed for the trade, and built warehouses along the quay. "
        "def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), value.strip()\n"
        "Dear team, the quarterly report is attached; revenue grew while costs stayed flat. ")
SETTINGS = [  # cycled over the requests
    {"temperature": 0.0},
    {"temperature": 0.8, "top_p": 0.9},
    {"temperature": 0.0, "repetition_penalty": 1.2},
    {"temperature": 0.7, "top_p": 0.95, "presence_penalty": 0.5, "frequency_penalty": 0.3},
]


@dataclass
class Timing:
    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    wall: float = 0.0
    peak_rss_mb: float = 0.0
    peak_device_mb: float = 0.0  # CUDA memory allocated at the peak (0 on CPU)

    rows: int = 1  # sequences decoding side by side (1 for the sequential peers)

    def decode_rate(self) -> float:
        """Steady decode tok/s: every row gains one token per gap, so rows / mean gap."""
        return self.rows / statistics.fmean(self.gaps)

    def row(self, name: str) -> str:
        gaps = sorted(self.gaps) or [0.0]
        p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
        return (f"{name:<34} {self.tokens / self.wall:8.1f} {self.decode_rate():8.1f} "
                f"{1000 * statistics.median(self.ttft):9.1f} {1000 * statistics.median(gaps):8.1f} "
                f"{1000 * p99:8.1f} {self.peak_rss_mb:8.0f} {self.peak_device_mb:8.0f}")


def device_peak_mb(device: torch.device) -> float:
    """The CUDA allocator's peak since the last call (0 on CPU)."""
    if device.type != "cuda":
        return 0.0
    peak = torch.cuda.max_memory_allocated(device) / 2**20
    torch.cuda.reset_peak_memory_stats(device)
    return peak


class RssPeak:
    """Peak resident memory of this process while the block runs (sampled, /proc)."""

    def __enter__(self):
        self.peak, self._stop = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.05):
            with open("/proc/self/statm") as handle:
                self.peak = max(self.peak, int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def make_requests(tokenizer, count: int, tokens: int, seed: int = 0) -> list[tuple[list[int], dict]]:
    rng = random.Random(seed)
    corpus = tokenizer(TEXT * 12).input_ids
    out = []
    for i in range(count):
        length = rng.randint(64, 256)
        start = rng.randint(0, len(corpus) - length)
        out.append((corpus[start:start + length], dict(SETTINGS[i % len(SETTINGS)], seed=1000 + i)))
    return out


def run_engine(engine: Engine, requests, tokens: int, adapters: list | None = None) -> Timing:
    """The requests submitted at once; `adapters`: each one's AdapterRef or None (bench/lora.py)."""
    timing = Timing(rows=len(requests))
    ended = threading.Event()
    remaining = [len(requests)]
    lock = threading.Lock()

    def sink_for(submitted_at: list[float]):
        last = [None]

        def sink(events):
            now = time.perf_counter()
            for event in events:
                if isinstance(event, Error):
                    raise SystemExit(f"request failed: {event}")
                if isinstance(event, Token):
                    if last[0] is None:
                        timing.ttft.append(now - submitted_at[0])
                    else:
                        timing.gaps.append(now - last[0])
                    last[0] = now
                    timing.tokens += 1
                if isinstance(event, Done):
                    with lock:
                        remaining[0] -= 1
                        if remaining[0] == 0:
                            ended.set()
        return sink

    prepared = []
    for index, (ids, settings) in enumerate(requests):
        chosen = {k: v for k, v in settings.items() if k != "seed"}
        params = SamplingParams(max_tokens=tokens, min_tokens=tokens, **chosen,
                                seed=[settings["seed"]])
        prepared.append(engine.prepare(GenerateRequest(request_id=uuid.uuid4().hex, model="bench", prompt_ids=ids,
                                                       params=params, adapter=adapters[index] if adapters else None)))
    start = time.perf_counter()
    for item in prepared:
        engine.submit(item, sink_for([time.perf_counter()]))
    ended.wait()
    timing.wall = time.perf_counter() - start
    return timing


class StampStreamer:
    """transformers streamer that notes when each generated token comes out."""

    def __init__(self):
        self.stamps: list[float] = []
        self._prompt_seen = False

    def put(self, value):
        if self._prompt_seen:
            self.stamps.append(time.perf_counter())
        self._prompt_seen = True

    def end(self):
        pass


def run_transformers(model, requests, tokens: int) -> Timing:
    timing = Timing()
    for ids, settings in requests:
        sampled = settings.get("temperature", 1.0) > 0
        extra = {"do_sample": True, "temperature": settings["temperature"], "top_p": settings.get("top_p", 1.0),
                 "top_k": 0} if sampled else {"do_sample": False}
        torch.manual_seed(settings["seed"])
        streamer = StampStreamer()
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(torch.tensor([ids], device=model.device),
                           attention_mask=torch.ones(1, len(ids), dtype=torch.long, device=model.device),
                           max_new_tokens=tokens, min_new_tokens=tokens, streamer=streamer,
                           repetition_penalty=settings.get("repetition_penalty", 1.0),
                           pad_token_id=model.generation_config.eos_token_id, **extra)
        stamps = streamer.stamps
        timing.ttft.append(stamps[0] - start)
        timing.gaps += [b - a for a, b in pairwise(stamps)]
        timing.tokens += len(stamps)
        timing.wall += stamps[-1] - start
    return timing


def ensure_llamacpp() -> Path | None:
    python = LLAMACPP / "bin" / "python"
    probe = [str(python), "-c", "import llama_cpp"]
    if python.exists() and subprocess.run(probe, capture_output=True, check=False).returncode == 0:
        return python
    print("building llama-cpp-python into .bench/llamacpp (compiles llama.cpp; several minutes) ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(LLAMACPP)], check=True)
    built = subprocess.run([str(LLAMACPP / "bin" / "pip"), "install", "-q", "llama-cpp-python"], check=False)
    if built.returncode != 0 or subprocess.run(probe, capture_output=True, check=False).returncode != 0:
        print("llama-cpp-python could not be installed: the llama.cpp column is skipped")
        return None
    return python


def run_llamacpp(python: Path, requests, tokens: int, threads: int) -> Timing | None:
    job = {"gguf": str(default_gguf_path()), "threads": threads, "tokens": tokens,
           "requests": [{"ids": ids, "settings": settings} for ids, settings in requests]}
    script = Path(__file__).parent / "peers" / "llamacpp_run.py"
    done = subprocess.run([str(python), str(script)], input=json.dumps(job), capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        print(f"llama.cpp run failed: {done.stderr[-2000:]}")
        return None
    result = json.loads(done.stdout)
    timing = Timing(peak_rss_mb=result["peak_rss_mb"])
    for item in result["requests"]:
        timing.ttft.append(item["ttft"])
        timing.gaps += item["gaps"]
        timing.tokens += item["tokens"]
        timing.wall += item["wall"]
    return timing


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", default=os.environ.get("SLUICE_BENCH_QUICK") == "1")
    parser.add_argument("--concurrency", default=None, help="comma-separated request counts")
    parser.add_argument("--tokens", type=int, default=None)
    parser.add_argument("--baseline-requests", type=int, default=None, help="sequential peer runs")
    # torch threads of our engine: 1 by default, and the engine decodes in row groups on the cores left
    # (worker/threads.py), so it uses every core; two OpenMP threads that spin-wait on a shared 2-core
    # box run 3-9x slower (see worker/engine/README.md)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--peer-threads", default=None,
                        help="comma-separated thread counts the peers each run at (default: 1 and every core); "
                             "ratios are against each peer's fastest")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--quantization", default="none",
                        help="comma-separated engine modes, each measured: none, w8a8 (CPU float32), "
                             "nf4, fp4, int8 (bitsandbytes, loaded as models of their own)")
    parser.add_argument("--device", default="auto", help="cpu, cuda or auto (cuda where present)")
    parser.add_argument("--no-llamacpp", action="store_true")
    args = parser.parse_args()
    modes = args.quantization.split(",")
    concurrency = [int(c) for c in (args.concurrency or ("1,4,16" if args.quick else "1,4,16,64")).split(",")]
    tokens = args.tokens or (32 if args.quick else 128)
    baseline_requests = args.baseline_requests or (2 if args.quick else 4)
    cores = os.cpu_count() or 1
    peer_threads = sorted({int(t) for t in (args.peer_threads or f"1,{cores}").split(",")})

    os.environ.setdefault("SLUICE_MODEL_CACHE", str(REPO / ".data" / "test-model-cache"))
    torch.set_num_threads(args.threads)
    llamacpp = None if args.no_llamacpp else ensure_llamacpp()
    data_dir = REPO / ".bench" / "worker"
    # quantization "none" pinned: "auto" would load nf4 on CUDA, and the peer runs these weights
    loaded = load_model(ModelConfig(dtype=args.dtype, device=args.device, quantization="none"), data_dir)
    requests = make_requests(loaded.tokenizer, max(concurrency + [baseline_requests]), tokens)
    print(f"SmolLM2-135M {args.dtype} on {loaded.device}, engine: {args.threads} torch threads x "
          f"{decode_threads(ModelConfig())} "
          f"decode threads, peers: {', '.join(map(str, peer_threads))} threads; {tokens} new tokens, prompts "
          f"64-256 tokens; load average at start {os.getloadavg()[0]:.1f} on {cores} cores")
    results: dict[str, Timing] = {}
    for mode in modes:  # the transformers peer always runs the float32 weights
        weights = (load_model(ModelConfig(dtype=args.dtype, device=args.device, quantization=mode), data_dir)
                   if mode in BITSANDBYTES else dataclasses.replace(loaded, quantization=mode))
        engine = Engine(weights, ModelConfig(dtype=args.dtype, device=args.device, max_batch_size=max(concurrency),
                                             max_context=1024))
        engine.start()
        try:
            run_engine(engine, requests[:2], 4)  # warm-up
            for count in concurrency:
                device_peak_mb(weights.device)  # the peak of this point alone
                with RssPeak() as rss:
                    timing = run_engine(engine, requests[:count], tokens)
                timing.peak_rss_mb = rss.peak
                timing.peak_device_mb = device_peak_mb(weights.device)
                results[_engine_row(mode, count)] = timing
                print(f"  {timing.row(_engine_row(mode, count))}  load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            engine.stop()
    peers: dict[str, list[Timing]] = {"transformers": [], "llama.cpp": []}
    for threads in peer_threads:
        with RssPeak() as rss, intra_op_threads(threads):
            run_transformers(loaded.model, requests[:1], 4)  # warm-up
            base = run_transformers(loaded.model, requests[:baseline_requests], tokens)
        base.peak_rss_mb = rss.peak
        results[f"transformers generate(), {threads} thr"] = base
        peers["transformers"].append(base)
        print(f"  transformers {threads} threads done, load {os.getloadavg()[0]:.1f}", flush=True)
        peer = run_llamacpp(llamacpp, requests[:baseline_requests], tokens, threads) if llamacpp else None
        if peer is not None:
            results[f"llama.cpp Q4_1 GGUF, {threads} thr"] = peer
            peers["llama.cpp"].append(peer)
    print(f"load average at end {os.getloadavg()[0]:.1f}\n")
    print("tok/s: generated tokens over wall time, prefill included; decode: rows / mean inter-token gap; "
          "peers run one request at a time")
    print(f"{'':<34} {'tok/s':>8} {'decode':>8} {'TTFT p50':>9} {'ITL p50':>8} {'ITL p99':>8} {'RSS MB':>8} "
          f"{'GPU MB':>8}")
    for name, timing in results.items():
        print(timing.row(name))
    print()
    best = {name: max(timings, key=Timing.decode_rate) for name, timings in peers.items() if timings}
    for mode, count in ((mode, count) for mode in modes for count in concurrency):
        ours = results[_engine_row(mode, count)]
        line = f"{mode} x{count}:"
        for name, peer in best.items():
            line += (f" decode {ours.decode_rate() / peer.decode_rate():5.2f}x {name} "
                     f"(overall {ours.tokens / ours.wall / (peer.tokens / peer.wall):4.2f}x)")
        print(line)
    print("ratios against each peer at its fastest thread count; targets: x16 >= 10x transformers and "
          ">= 2x llama.cpp; x1 >= 1x transformers")


def _engine_row(mode: str, count: int) -> str:
    return f"sluice engine{'' if mode == 'none' else ' ' + mode}, {count} concurrent"


if __name__ == "__main__":
    main()
