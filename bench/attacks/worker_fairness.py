"""A hostile tenant, second round (issue #43 items 4, 8, 12): another team's TTFT idle and under each attack, same run.

    .venv/bin/python bench/attacks/worker_fairness.py [--quick] [--rows 8] [--probes 20] [--quiet-worker real|stub]

Each attack beside a quiet team that sends one-token requests one after another (bench/fairness.py's `probe` and
`phase`: submit -> first token, p50 / p99, and the p99 in engine steps):
- rows: one request of `n` = every row, kept in flight with long outputs (before, it held every row until it
  ended: the quiet team waited 45.6 s). In-process Engine, as bench/fairness.py drives it.
- grammar: two teams keep heavy distinct JSON schemas compiling (seconds each) through the worker's HTTP app;
  the quiet team's plain requests go through the same app (before, the compiles' requests held the threads that
  prepare every request: 0.24 s became 14.8 s).
- large answers: a team keeps non-streamed `n` = 32, `top_logprobs` = 20 answers of megabytes coming through a
  real `sluice serve` (in front of the test kit's protocol worker, which sends them at once); the probes are
  another team's streamed one-token chat (time to its first chunk) and the gateway's `GET /livez`, which answers on
  the event loop every team's streams share (before: 1.1 s). The same probe asks a bare HTTP server on this host,
  interleaved (the control): what the attack adds to that tail is the host's two busy cores, not the gateway. The
  stub worker's and the attackers' threads, which in production run on other machines, run 10 nice steps below the
  gateway (bench/harness/stand_ins.py). The quiet team's model has a worker process of its own (`--quiet-worker`):
  by default a real `python -m worker` with SmolLM2, as the admission attacks' probes meet it (a prefill and a
  step: the TTFT another team gets); `stub`, `python -m testkit.protocol_worker` answering one token at once,
  leaves the gateway and the host alone in the probe's few milliseconds, a tail the host's busy cores double for
  a bare server too. Each phase also says where the gateway's CPU time went
  (`CpuBook`): its event loop thread's time on a core and time runnable but waiting for one (Linux schedstat), its
  other threads', the render process's, and this process's (stub worker and attackers), beside the control's loop.
Prints each phase and the ratio of each attack's p99 to the idle p99 (the bar: within 2x). No assertions.
`--quick` (or SLUICE_BENCH_QUICK=1) runs a small version.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import psutil
import torch

# run as a script, this file's folder comes first on sys.path: the repository goes first instead
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.fairness import BusyTenant, phase
from bench.harness.stand_ins import below_the_gateway
from bench.harness.stats import percentile
from common.long_lived import freeze_what_lives_on
from common.protocol import (
    Accepted,
    Constraint,
    Done,
    Finish,
    GenerateRequest,
    ModelConfig,
    ModelInfo,
    SamplingParams,
    Token,
    TopLogprob,
)
from testkit.admin import team_key
from testkit.protocol_worker import MODEL as STUB_MODEL
from testkit.protocol_worker import Reply, sluice_on_protocol_worker, worker_process
from testkit.servers import free_port, wait_for_port
from testkit.sluice import standalone_worker
from worker.engine.engine import Engine
from worker.loading import load_model
from worker.server import create_worker_app

REPO = Path(__file__).resolve().parents[2]
ADMIN_KEY = "bench-worker-fairness-admin-key-0123456789"
QUIET_MODEL = "quiet-model"  # the quiet team's, on a worker process of its own (`--quiet-worker`)


class WideRequests(BusyTenant):
    """A tenant that keeps one request of `n` = every row in flight, another queued behind it, until stopped."""

    prefix = "wide"

    def __init__(self, engine: Engine, rows: int, tokens: int):
        super().__init__(engine, tokens)
        self.rows = rows

    def _wanted(self) -> list[GenerateRequest]:
        if self.outstanding >= 2:
            return []
        return [GenerateRequest(request_id=f"wide-{next(self.ids)}", model="m", tenant="wide",
                                prompt="Write a long story about a river.",
                                params=SamplingParams(n=self.rows, max_tokens=self.tokens, temperature=1.0,
                                                      ignore_eos=True))]

    def _ready(self) -> bool:
        return len(self.engine.rows) >= self.rows  # it holds every row


def rows_attack(engine: Engine, rows: int, probes: int, tokens: int) -> dict[str, list[float]]:
    phase(engine, 2, "quiet")  # warm-up
    idle = phase(engine, probes, "quiet")
    parked = engine.scheduler.preemptions
    with WideRequests(engine, rows, tokens):
        attacked = phase(engine, probes, "quiet")
    print(f"  rows parked for the quiet team: {engine.scheduler.preemptions - parked} requests")
    return {"rows: idle": [s for s, _ in idle], f"rows: n = {rows} held": [s for s, _ in attacked]}


async def _grammar_phase(engine: Engine, probes: int, attack: bool) -> list[float]:
    """Plain one-token requests of a quiet team through the worker's HTTP app (on this loop, with its default
    thread pool), beside two teams that keep heavy distinct schemas compiling when `attack`."""
    info = ModelInfo(model_id="smol", model_dtype="float32", device="cpu", quantization="none",
                     max_context=engine.runner.max_context, max_rows=engine.max_rows, vocab_size=engine.vocab_size,
                     eos_token_ids=engine.model_eos)
    transport = httpx.ASGITransport(app=create_worker_app(engine, info))
    schemas = iter(range(10**9))
    async with httpx.AsyncClient(transport=transport, base_url="http://worker", timeout=900) as client:

        async def post(tenant: str, **params) -> httpx.Response:
            body = GenerateRequest(request_id=f"{tenant}-{time.monotonic_ns()}", model="m", tenant=tenant,
                                   prompt="JSON:", params=SamplingParams(max_tokens=1, **params))
            return await client.post("/generate", content=msgspec.json.encode(body))

        async def compiling(tenant: str) -> None:
            while True:  # seconds of compile each on the SmolLM2 vocabulary, never cached
                schema = json.dumps({"type": "string", "maxLength": 2500 + next(schemas)})
                answer = await post(tenant, constraint=Constraint("json_schema", schema))
                if answer.status_code == 429:  # the team's compiles are at their cap: it retries
                    await asyncio.sleep(0.05)

        attackers = [asyncio.create_task(compiling(t)) for t in ("schemas-a", "schemas-b") for _ in range(6)
                     if attack]
        try:
            if attack:
                await asyncio.sleep(3)  # their compiles under way
            await post("quiet")  # warm-up
            times = []
            for _ in range(probes):
                started = time.perf_counter()
                answer = await post("quiet")
                times.append(time.perf_counter() - started)
                assert answer.status_code == 200, answer.text
                await asyncio.sleep(0.02)
        finally:
            for task in attackers:
                task.cancel()
            await asyncio.gather(*attackers, return_exceptions=True)
            deadline = time.monotonic() + 120
            while engine.by_id and time.monotonic() < deadline:  # what they submitted ends while this loop runs
                await asyncio.sleep(0.05)
    label = "under compiles" if attack else "idle"
    print(f"  grammar {label}: p99 {percentile(times, 0.99) * 1000:.1f} ms, load {os.getloadavg()[0]:.1f}",
          flush=True)
    return times


def grammar_attack(engine: Engine, probes: int) -> dict[str, list[float]]:
    return {"grammar: idle": asyncio.run(_grammar_phase(engine, probes, False)),
            "grammar: two teams compiling": asyncio.run(_grammar_phase(engine, probes, True))}


def large_answer(choices: int, tokens: int, top: int) -> list:
    """What a worker sends for `n` = choices with `top` alternatives a token, all at once."""
    events: list = [Accepted(prompt_tokens=3, prompt_ids=[1, 2, 3], seeds=list(range(choices)))]
    for index in range(choices):
        events += [Token(index=index, token_id=t, text=" tok", piece=" tok", logprob=-0.5,
                         top_logprobs=[TopLogprob(k, -1.0 - k, f" alt{k}") for k in range(top)])
                   for t in range(tokens)]
        events.append(Finish(index=index, reason="length", text=" tok" * tokens, token_ids=list(range(tokens)),
                             seed=index))
    events.append(Done(prompt_tokens=3, completion_tokens=choices * tokens, compute_tokens=choices * tokens))
    return events


_PROBE = '''
import json, sys, time, httpx
targets = json.loads(sys.argv[2])  # {"get": url} or {"chat": url, "key": ..., "model": ...}
times = [[] for _ in targets]

def ttft(client, target):  # a streamed one-token chat: seconds to its first chunk
    body = {"model": target["model"], "max_tokens": 1, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    with client.stream("POST", target["chat"], json=body, headers={"authorization": "Bearer " + target["key"]}) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                return
    raise RuntimeError(f"no chunk: {r.status_code}")

with httpx.Client(timeout=60) as client:
    for _ in range(int(sys.argv[1])):
        for target, seen in zip(targets, times):  # interleaved: each sees the same moments of the attack
            started = time.perf_counter()
            if "get" in target:
                client.get(target["get"]).raise_for_status()
            else:
                ttft(client, target)
            seen.append(time.perf_counter() - started)
            time.sleep(0.01)
print(json.dumps(times))
'''

# the control: a bare HTTP server (no gateway, no framework) on the same host. What the attack adds to its tail is
# the host's (two busy cores shared with the attacker's clients and the stub worker in this bench), not the gateway's
_BARE_SERVER = '''
import asyncio, sys, uvloop
async def answer(reader, writer):
    try:
        while await reader.readuntil(b"\\r\\n\\r\\n"):
            writer.write(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\n\\r\\nok")
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(answer, "127.0.0.1", int(sys.argv[1]))
    await server.serve_forever()
uvloop.run(main())
'''


def _probes(targets: list[dict], count: int) -> list[list[float]]:
    """Latencies of each target (a GET's, or a streamed chat's time to first chunk), interleaved, probed from a
    process of their own: the stub worker and the attacker in this one would otherwise hold the probe back at this
    process's GIL."""
    probe = subprocess.run([sys.executable, "-c", _PROBE, str(count), json.dumps(targets)], capture_output=True,
                           text=True, check=True, timeout=900)
    return json.loads(probe.stdout)


@contextlib.contextmanager
def _bare_server() -> Iterator[tuple[str, int]]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", _BARE_SERVER, str(port)])
    try:
        wait_for_port(port, 60)
        yield f"http://127.0.0.1:{port}/", process.pid
    finally:
        process.kill()
        process.wait()


class CpuBook:
    """CPU seconds of the processes a large-answer phase runs, between `start` and `show`: what the gateway's loop
    thread ran and how long it was runnable without a core (schedstat: the kernel's counts, no sampling, so true on
    a loaded machine), the same for the control's loop, and what the gateway's other threads, its render process
    and this process (stub worker, attackers) spent. Work of the loop's own shows in its run time; the host's
    contention in both loops' waits (their means a turn differ with how often each wakes)."""

    def __init__(self, gateway: int, control: int):
        self.gateway, self.control = psutil.Process(gateway), control
        self.before: dict[str, float] = {}

    def _read(self) -> dict[str, float]:
        book = {}
        for name, pid in (("loop", self.gateway.pid), ("control", self.control)):
            run, wait, slices = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
            book |= {f"{name} ran": int(run) / 1e9, f"{name} waited": int(wait) / 1e9, f"{name} slices": int(slices)}
        threads = self.gateway.threads()
        book["gateway threads"] = sum(t.user_time + t.system_time for t in threads if t.id != self.gateway.pid)
        book["render process"] = 0.0
        for child in self.gateway.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                book["render process"] += sum(child.cpu_times()[:2])
        book["this process"] = sum(psutil.Process().cpu_times()[:2])
        return book

    def start(self) -> None:
        self.before = self._read()

    def show(self, label: str, answers: int) -> None:
        now = self._read()
        spent = {name: now[name] - self.before.get(name, 0.0) for name in now}
        per = f" (answers finished: {answers})" if answers else ""

        def loop(name: str) -> str:
            turns, ran, waited = max(1, round(spent[f"{name} slices"])), spent[f"{name} ran"], spent[f"{name} waited"]
            return (f"ran {ran * 1e3:.0f} ms, waited for a core {waited * 1e3:.0f} ms in {turns} turns "
                    f"({waited * 1e3 / turns:.2f} ms a turn)")

        print(f"  {label}{per}: gateway loop {loop('loop')}; control loop {loop('control')}; CPU s: gateway's other "
              f"threads {spent['gateway threads']:.2f}, render process {spent['render process']:.2f}, stub worker + "
              f"attackers {spent['this process']:.2f}", flush=True)


def _quiet_model(url: str) -> str:
    """The gateway's settings: no team limits, and QUIET_MODEL served by the worker at `url`."""
    return f'default_team_limits = {{}}\n[[models]]\nname = "{QUIET_MODEL}"\n' \
           f'provisioner = {{ kind = "static", urls = ["{url}"] }}\n'


@contextlib.contextmanager
def _quiet_worker(kind: str, data: Path) -> Iterator[str]:
    """The URL of the worker serving QUIET_MODEL: `stub`, a protocol worker that answers one token at once (what
    the probe then measures is the gateway and the host), or `real`, `python -m worker` with SmolLM2 (what the
    other team meets: a prefill and a step on the model, on this host's two cores beside the attack)."""
    if kind == "real":
        with standalone_worker(data / "quiet-worker", max_batch_size=8, name=QUIET_MODEL) as url:
            yield url
    else:
        with worker_process(model=QUIET_MODEL, token_delay=0.0, quiet=True) as stub:
            yield stub.url


def large_answer_attack(probes: int, tokens: int, quiet_worker: str) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as data, _bare_server() as (bare, control), \
            _quiet_worker(quiet_worker, Path(data)) as quiet_url, \
            sluice_on_protocol_worker(Path(data), ADMIN_KEY, _quiet_model(quiet_url)) as (server, worker):
        # encoded once: the stub worker stands in for another machine, its CPU is not the gateway's
        worker.replies, worker.record = [Reply(large_answer(32, tokens, 20), at_once=True)], False
        headers = {"authorization": f"Bearer {team_key(server, 'large-answers')}"}
        body = {"model": STUB_MODEL, "messages": [{"role": "user", "content": "Hi"}], "n": 32, "logprobs": True,
                "top_logprobs": 20, "max_tokens": tokens}
        stop, sizes = threading.Event(), []

        def attacker() -> None:
            below_the_gateway([threading.get_native_id()])
            with httpx.Client(timeout=300) as client:
                while not stop.is_set():
                    answer = client.post(f"{server.url}/v1/chat/completions", json=body, headers=headers)
                    sizes.append(len(answer.content))

        targets = [{"get": server.url + "/livez"}, {"get": bare},
                   {"chat": server.url + "/v1/chat/completions", "key": team_key(server, "quiet"),
                    "model": QUIET_MODEL}]
        book = CpuBook(server.process.pid, control)
        below_the_gateway()  # the stub worker's server thread
        book.start()
        idle = _probes(targets, probes)
        book.show("idle", 0)
        threads = [threading.Thread(target=attacker, daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()
        with contextlib.suppress(Exception):
            while not sizes:
                time.sleep(0.05)
        book.start()
        done = len(sizes)
        attacked = _probes(targets, probes)
        book.show("large answers", len(sizes) - done)
        stop.set()
        for thread in threads:
            thread.join()
    print(f"  large answers: {len(sizes)} of {statistics.median(sizes) / 2**20:.1f} MiB each")
    return {"/livez: idle": idle[0], "/livez: large answers": attacked[0],
            "control, bare server: idle": idle[1], "control, bare server: large answers": attacked[1],
            "quiet team's chat TTFT: idle": idle[2], "quiet team's chat TTFT: large answers": attacked[2]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", default=os.environ.get("SLUICE_BENCH_QUICK") == "1")
    parser.add_argument("--rows", type=int, default=8, help="the engine's max_batch_size")
    parser.add_argument("--probes", type=int, default=None, help="quiet requests per phase")
    parser.add_argument("--attacks", default="answers,rows,grammar", help="which of answers, rows, grammar")
    parser.add_argument("--livez-probes", type=int, default=None,
                        help="/livez probes per phase of the large answers (default 1,000, 32 with --quick): p99 "
                             "is then the 10th slowest, not one sample")
    parser.add_argument("--quiet-worker", choices=("real", "stub"), default="real",
                        help="beside large answers, the quiet team's model on a real worker process (SmolLM2) or on "
                             "a stub worker (one token at once: the gateway and the host alone)")
    args = parser.parse_args()
    probes = args.probes or (8 if args.quick else 30)
    attacks = set(args.attacks.split(","))
    logging.getLogger("httpx").setLevel(logging.WARNING)

    livez_probes = args.livez_probes or (32 if args.quick else 1000)
    results = large_answer_attack(livez_probes, 100 if args.quick else 300, args.quiet_worker) \
        if "answers" in attacks else {}
    if not attacks & {"rows", "grammar"}:
        return report(results)
    os.environ.setdefault("SLUICE_MODEL_CACHE", str(REPO / ".data" / "test-model-cache"))
    torch.set_num_threads(1)
    loaded = load_model(ModelConfig(dtype="float32"), REPO / ".bench" / "worker")
    engine = Engine(loaded, ModelConfig(dtype="float32", max_batch_size=args.rows, max_context=512))
    engine.start()
    freeze_what_lives_on()  # as a worker does once started
    print(f"SmolLM2-135M float32, {args.rows} rows; {probes} quiet one-token probes per phase; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    try:
        if "rows" in attacks:
            results |= rows_attack(engine, args.rows, probes, 64 if args.quick else 256)
        if "grammar" in attacks:
            results |= grammar_attack(engine, probes)
    finally:
        engine.stop()
    report(results)


def report(results: dict[str, list[float]]) -> None:
    print(f"\n{'another team':<36} {'p50 ms':>9} {'p99 ms':>9} {'p99 / idle':>11}")
    idle = None
    for name, times in results.items():
        if name.endswith("idle"):
            idle = percentile(times, 0.99)
        print(f"{name:<36} {statistics.median(times) * 1000:>9.1f} {percentile(times, 0.99) * 1000:>9.1f} "
              f"{percentile(times, 0.99) / idle:>10.2f}x")
    if "control, bare server: idle" in results:
        host = percentile(results["control, bare server: large answers"], 0.99) / \
            percentile(results["control, bare server: idle"], 0.99)
        gateway = percentile(results["/livez: large answers"], 0.99) / percentile(results["/livez: idle"], 0.99)
        print(f"/livez beside large answers, over what the host's load adds to a bare server's tail: "
              f"{gateway / host:.2f}x")
    print("\nbar: each attack's p99 within 2x of its idle p99 (TTFT of a one-token request; beside large answers also "
          "/livez).")


if __name__ == "__main__":
    main()
