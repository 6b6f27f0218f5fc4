"""Cold start: a request to a model scaled to zero, until its first token; and what the activator adds
once the endpoint is warm.

    .venv/bin/python bench/cold_start.py [--model default|tiny|both] [--runs 3] [--warm-requests 200]
                                         [--burst 100] [--burst-tokens 16] [--quantization auto|w8a8|q4|...]
                                         [--quick]

`--model default` is SmolLM2-135M-Instruct (its GGUF metadata cached); `tiny` the tiny random Llama the
tests use (testkit/tiny_model.py, written to a temporary directory): what is left when the weights
cost nothing, i.e. the activator, the process and the engine.

Each run builds the gateway's `Endpoints` service in this process (its SQLite store in a temporary
data dir; the weights' cache shared through SLUICE_MODEL_CACHE, so they are cached) with one local
endpoint, min_replicas 0, and sends one streamed request through the activator and the failover
proxy to the worker that wakes for it, timing the request until its first token. The worker reports
its own start phase by phase (`/info` start_seconds): process start, imports, weight load, engine
(lean runner, KV cache), warm-up, compile (the TorchScript decode layers). Two ways to wake:
- standby: the default, a spare worker process already imported waits for an assignment;
- cold: `[scaling] standby_worker = false`, a new process imports everything first.
The peer, measured in the same run: a fresh Python process loading the same weights with transformers
(`from_pretrained`; the default model from its GGUF) and generating one token, what a plain transformers
server pays.

Then, warm: the activator's own latency (acquire + release of a lease on the ready endpoint, p50/p99)
and the time to first token through the service against the same request sent to the worker directly.
The target on this machine: <= 3 s from the request to its first token.

Last, a burst at zero: `--burst` non-streamed requests of `--burst-tokens` tokens each (`ignore_eos`) sent
together to the endpoint scaled to zero (one replica allowed, woken from the standby spare), until the last
answer; then, in the same run once the woken worker has settled (its spare refilled, its background work
done), the same burst again, warm. The bar: the burst from zero is served within the warm burst's time + 2 s
(the wake itself, and nothing after it running slower than warm).

No assertions; other processes share the cores, so each figure is a median with its spread over `--runs`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# run as a script: this checkout first, and not bench/ (bench/worker.py would shadow the worker package)
REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import httpx  # noqa: E402
import msgspec  # noqa: E402

from common.protocol import WORKER_SECRET_HEADER, GenerateRequest, ModelInfo, SamplingParams, Token  # noqa: E402
from gateway.edge.access_log import configure_logging  # noqa: E402
from gateway.endpoints.scaling import ScalingSettings  # noqa: E402
from gateway.endpoints.service import Endpoints  # noqa: E402
from gateway.endpoints.spec import parse_endpoint  # noqa: E402
from gateway.replicas.trust import worker_secret  # noqa: E402
from gateway.serving.collect import collect  # noqa: E402
from gateway.serving.worker_client import WorkerClient  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
TINY = "tiny/llama"
CACHE = Path(os.environ.setdefault("SLUICE_MODEL_CACHE", str(REPO / ".data" / "test-model-cache")))
PHASES = ("process_start", "imports", "weights", "engine", "warm_up", "compile")
PEER = """
import sys, time
began = float(sys.argv[1])
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from pathlib import Path
where = Path(sys.argv[2])
source = {"pretrained_model_name_or_path": where.parent, "gguf_file": where.name} if where.suffix == ".gguf" else \
    {"pretrained_model_name_or_path": where}
tokenizer = AutoTokenizer.from_pretrained(**source)
model = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
model.generate(ids, max_new_tokens=1, do_sample=False)
print(time.time() - began)
"""


def request(index: int, model: str) -> GenerateRequest:
    return GenerateRequest(request_id=f"cold-{index}", model=model, prompt="The capital of France is",
                           params=SamplingParams(max_tokens=4, temperature=0.0), stream=True)


async def first_token(endpoints: Endpoints, endpoint, index: int) -> tuple[float, object]:
    """Seconds from the request to its first token, and the lease it ran on."""
    started = time.monotonic()
    deadline = started + 300
    lease = await endpoint.activator.acquire(deadline)
    waited = lease.waited_s
    events = WorkerClient(endpoints).stream(endpoint, lease, request(index, endpoint.name), deadline)
    try:
        async for event in events:
            if isinstance(event, Token):
                return time.monotonic() - started, lease, waited
    finally:
        await events.aclose()
    raise RuntimeError("no token")


async def cold_run(data_dir: Path, model: dict, standby: bool, warm_requests: int) -> dict:
    settings = ScalingSettings(standby_worker=standby)
    spec = parse_endpoint({**model, "min_replicas": 0, "max_replicas": 1, "idle_seconds": 3600})
    endpoints = await Endpoints.open(f"sqlite:///{data_dir}/sluice.db", [spec], data_dir, settings)
    await endpoints.start()
    try:
        if standby:
            await spare_ready(endpoints)
        endpoint = endpoints.resolve(spec.name, None)
        seconds, lease, waited = await first_token(endpoints, endpoint, 0)
        info = msgspec.json.decode((await lease.replica.get("/info"))[1], type=ModelInfo)
        result = {"first_token": seconds, "waited": waited, **info.start_seconds}
        if warm_requests:
            result.update(await warm(endpoints, endpoint, lease.replica.url, warm_requests))
        return result
    finally:
        await endpoints.drain_and_stop()


async def warm(endpoints: Endpoints, endpoint, url: str, count: int) -> dict:
    acquire = []
    for _ in range(count):
        started = time.perf_counter()
        lease = await endpoint.activator.acquire(time.monotonic() + 10)
        lease.release()
        acquire.append(time.perf_counter() - started)
    through, direct = [], []
    body = msgspec.json.encode(request(1, endpoint.name))
    # straight to the worker: with the secret the gateway gave it (worker_trust.py), or it refuses
    async with httpx.AsyncClient(base_url=url, timeout=60, headers={WORKER_SECRET_HEADER: worker_secret()}) as client:
        for index in range(max(10, count // 10)):
            seconds, _, _ = await first_token(endpoints, endpoint, index + 2)
            through.append(seconds)
            started = time.monotonic()
            async with client.stream("POST", "/generate", content=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if '"type":"token"' in line:
                        direct.append(time.monotonic() - started)
                        break
    return {"acquire": acquire, "through": through, "direct": direct}


def burst_request(index: int, model: str, tokens: int) -> GenerateRequest:
    return GenerateRequest(request_id=f"burst-{index}", model=model, prompt=f"Tell me about the number {index}.",
                           params=SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))


async def served(endpoints: Endpoints, endpoint, index: int, tokens: int) -> tuple[int, float, float, object]:
    """One non-streamed request through the activator and the failover proxy: its completion tokens, the time it
    waited in the activator's queue (at zero: the wake), when it was answered (monotonic) and its replica."""
    deadline = time.monotonic() + 600
    lease = await endpoint.activator.acquire(deadline)
    events = WorkerClient(endpoints).stream(endpoint, lease, burst_request(index, endpoint.name, tokens), deadline)
    result = await collect(events)
    if result.done is None:
        raise RuntimeError(f"burst request {index} ended without its usage")
    return result.done.completion_tokens, lease.waited_s, time.monotonic(), lease.replica


async def burst(endpoints: Endpoints, endpoint, count: int, tokens: int) -> dict:
    """Seconds from sending `count` requests together until the last answer, until the first was released onto a
    replica (the wake, from zero) and until the first answer; and the replica's start phases (`/info`)."""
    started = time.monotonic()
    answered = await asyncio.gather(*(served(endpoints, endpoint, index, tokens) for index in range(count)))
    if sum(a[0] for a in answered) != count * tokens:
        raise RuntimeError(f"the burst got {sum(a[0] for a in answered)} tokens, not {count * tokens}")
    info = msgspec.json.decode((await answered[0][3].get("/info"))[1], type=ModelInfo)
    return {"total": max(a[2] for a in answered) - started, "wake": min(a[1] for a in answered),
            "first_answer": min(a[2] for a in answered) - started, "start_seconds": info.start_seconds}


async def burst_run(data_dir: Path, model: dict, count: int, tokens: int) -> dict:
    """The burst to the endpoint at zero (woken from the spare), then the same burst warm, in one service."""
    spec = parse_endpoint({**model, "min_replicas": 0, "max_replicas": 1, "idle_seconds": 3600})
    endpoints = await Endpoints.open(f"sqlite:///{data_dir}/sluice.db", [spec], data_dir, ScalingSettings())
    await endpoints.start()
    try:
        await spare_ready(endpoints)
        endpoint = endpoints.resolve(spec.name, None)
        from_zero = await burst(endpoints, endpoint, count, tokens)
        await spare_ready(endpoints)  # settled: the refill's imports and the worker's background work are over
        await asyncio.sleep(1.0)
        warm_ = await burst(endpoints, endpoint, count, tokens)
        print(f"  burst from zero: wake {from_zero['wake']:.2f} s, first answer {from_zero['first_answer']:.2f} s, "
              f"last {from_zero['total']:.2f} s; warm: first answer {warm_['first_answer']:.2f} s, last "
              f"{warm_['total']:.2f} s; the woken worker's start: {from_zero['start_seconds']}", flush=True)
        return {"burst_from_zero": from_zero["total"], "burst_wake": from_zero["wake"], "burst_warm": warm_["total"]}
    finally:
        await endpoints.drain_and_stop()


async def spare_ready(endpoints: Endpoints) -> None:
    deadline = time.monotonic() + 300
    while not endpoints.standby.ready:
        if time.monotonic() > deadline:
            raise TimeoutError("the standby worker did not finish importing")
        await asyncio.sleep(0.1)


def peer_run(weights: Path) -> float:
    began = time.time()
    out = subprocess.run([sys.executable, "-c", PEER, repr(began), str(weights)], capture_output=True, text=True,
                         env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def spread(values: list[float], unit: float = 1.0, digits: int = 2) -> str:
    scaled = [v * unit for v in values]
    median = statistics.median(scaled)
    return f"{median:.{digits}f} ({min(scaled):.{digits}f}-{max(scaled):.{digits}f})"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def bench_model(label: str, model: dict, weights: Path, args: argparse.Namespace) -> None:
    results: dict[str, list[dict]] = {"standby": [], "cold": [], "burst": []}
    peers = []
    for run in range(args.runs):
        for mode in ("standby", "cold"):
            with tempfile.TemporaryDirectory(prefix="sluice-cold-") as data:
                warm_count = args.warm_requests if mode == "standby" and run == 0 else 0
                results[mode].append(asyncio.run(cold_run(Path(data), model, mode == "standby", warm_count)))
        peers.append(peer_run(weights))
        line = (f"{label} run {run + 1}/{args.runs}: standby {results['standby'][-1]['first_token']:.2f} s, "
                f"cold {results['cold'][-1]['first_token']:.2f} s, transformers {peers[-1]:.2f} s")
        if args.burst:
            with tempfile.TemporaryDirectory(prefix="sluice-burst-") as data:
                results["burst"].append(asyncio.run(burst_run(Path(data), model, args.burst, args.burst_tokens)))
            line += (f"; burst of {args.burst} from zero {results['burst'][-1]['burst_from_zero']:.2f} s, "
                     f"warm {results['burst'][-1]['burst_warm']:.2f} s")
        print(line, flush=True)

    print(f"\nrequest -> first token, {label} scaled to zero, cached weights; median (min-max) of {args.runs}; "
          f"load average before: {os.getloadavg()[0]:.1f}")
    print(f"{'':32}{'standby':>22}{'cold':>22}")
    rows = [("request -> first token (s)", "first_token"), ("  activator wait (s)", "waited")]
    rows += [(f"  worker: {phase} (s)", phase) for phase in PHASES]
    rows += [("  worker: total to ready (s)", "total")]
    for label_, key in rows:
        cells = [spread([r.get(key, 0.0) for r in results[mode]]) for mode in ("standby", "cold")]
        print(f"{label_:32}{cells[0]:>22}{cells[1]:>22}")
    print(f"{'transformers, fresh process (s)':32}{spread(peers):>22}")
    for mode in ("standby", "cold"):
        ours = statistics.median(r["first_token"] for r in results[mode])
        print(f"{label} {mode}: {ours:.2f} s = {ours / statistics.median(peers):.2f}x the transformers peer; "
              f"target <= 3 s: {'met' if ours <= 3 else 'missed'}")
    if args.burst:
        bursts = results["burst"]
        from_zero, warm_ = (statistics.median(r[key] for r in bursts) for key in ("burst_from_zero", "burst_warm"))
        print(f"\nburst of {args.burst} non-streamed {args.burst_tokens}-token requests (ignore_eos), one replica "
              f"allowed; median (min-max) of {len(bursts)}:")
        print(f"  from zero (woken from the spare): {spread([r['burst_from_zero'] for r in bursts])} s")
        print(f"    of which the wake:              {spread([r['burst_wake'] for r in bursts])} s")
        print(f"  warm, same run:                   {spread([r['burst_warm'] for r in bursts])} s")
        print(f"{label} burst: from zero {from_zero:.2f} s against warm {warm_:.2f} s "
              f"(+{from_zero - warm_:.2f} s); bar: within warm + 2 s: {'met' if from_zero <= warm_ + 2 else 'missed'}")
    if not args.warm_requests:
        return
    warm_run = results["standby"][0]
    acquire = warm_run["acquire"]
    print(f"\nwarm activator: acquire + release p50 {percentile(acquire, 0.5) * 1e6:.0f} us, "
          f"p99 {percentile(acquire, 0.99) * 1e6:.0f} us over {len(acquire)}")
    through, direct = warm_run["through"], warm_run["direct"]
    print(f"warm first token: through the service p50 {percentile(through, 0.5) * 1e3:.1f} ms "
          f"p99 {percentile(through, 0.99) * 1e3:.1f} ms; straight to the worker p50 "
          f"{percentile(direct, 0.5) * 1e3:.1f} ms p99 {percentile(direct, 0.99) * 1e3:.1f} ms "
          f"(ratio p50 {percentile(through, 0.5) / percentile(direct, 0.5):.2f})\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("default", "tiny", "both"), default="both")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm-requests", type=int, default=200)
    parser.add_argument("--burst", type=int, default=100, help="requests in the burst at zero (0: none)")
    parser.add_argument("--burst-tokens", type=int, default=16)
    parser.add_argument("--quantization", default="auto", help="the endpoint's `quantization` (auto: the worker picks)")
    parser.add_argument("--quick", action="store_true", default=bool(os.environ.get("SLUICE_BENCH_QUICK")))
    args = parser.parse_args()
    if args.quick:
        args.runs, args.warm_requests = 1, 50
    configure_logging("json", level=30)  # warnings only: the workers' own lines go to stderr
    os.environ["SLUICE_LOG_FORMAT"] = "json"
    if args.model in ("tiny", "both"):
        # the test suite's tiny model, built the same way (imported only when asked for)
        from testkit.tiny_model import write_tiny_model

        with tempfile.TemporaryDirectory(prefix="sluice-tiny-") as tiny:
            write_tiny_model(Path(tiny))
            bench_model("the tiny random Llama", {"name": TINY, "source": tiny, "threads": 1, "decode_threads": 1},
                        Path(tiny), args)
    if args.model in ("default", "both"):
        from worker.loading import default_gguf_path

        weights = default_gguf_path()  # the peer loads the GGUF itself (transformers dequantizes it)
        bench_model(f"SmolLM2-135M ({args.quantization})", {"name": MODEL, "quantization": args.quantization},
                    weights, args)


if __name__ == "__main__":
    main()
