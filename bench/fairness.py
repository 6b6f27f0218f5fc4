"""Fairness on a shared replica: a quiet team's time to first token beside a hostile neighbour, same run.

    .venv/bin/python bench/fairness.py [--quick] [--rows 16] [--probes 20] [--hostile-tokens 32]

One Engine (in-process, as bench/worker.py drives it). A quiet tenant sends `--probes` one-token requests one
after another and we take its TTFT (submit -> first token) p50 / p99 in three phases:
- idle: nothing else runs;
- hostile, fair turns: another tenant keeps 128-prompt requests (128 worker requests of `--hostile-tokens`
  tokens each) waiting at all times, every row busy; the quiet tenant's requests carry their own tenant, so
  the engine admits them in turns (worker/engine/fair_turns.py);
- hostile, one queue: the same, but both name the same tenant, which is first come, first served (the
  worker before fair turns, or a gateway that names no tenant).
Prints each phase, the ratio of each hostile p99 to the idle p99, and the p99 in engine steps (which a loaded
machine does not change). No assertions; the bar: the
quiet team's p99 TTFT within 2x of idle under the hostile neighbour. With fair turns a quiet tenant running
nothing takes a row at once, the hostile tenant's newest row parked (worker/engine/preemption.py), its prompt
goes next even when it arrives in the middle of a step's prefill forwards (worker/engine/scheduler.py), and then
it shares a step with every busy row: on a CPU a 16-row step costs several times a 1-row step, so the time ratio
stays above 1 where the step count does not (a GPU's step barely grows with rows).
`--quick` (or SLUICE_BENCH_QUICK=1) runs a small version for `make bench`.

`--attack NAME` (repeatable; `all` for every one) also runs the hostile tenant's second round (issue #43), each in
its own process, each printing the quiet team's p99 against its idle p99 in the same run (bar: within 2x):
- `admission` (bench/attacks/worker_admission.py): huge id lists, 4 MB and 300 KB prompts, big token counts;
- `rows`, `grammar`, `answers` (bench/attacks/worker_fairness.py): one request of `n` = every row, two teams'
  grammar compiles, large collected answers beside `/livez`;
- `bodies` (bench/attacks/edge.py): 100 stalled 3.8 MB request bodies.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

# run as a script, this file's folder comes first on sys.path and its name would shadow the package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: bench.harness beside the packages

from bench.harness.stats import percentile
from common.long_lived import freeze_what_lives_on
from common.protocol import Done, Error, GenerateRequest, ModelConfig, SamplingParams, Token
from worker.engine.engine import Engine
from worker.loading import load_model

REPO = Path(__file__).resolve().parents[1]
BATCH = 128  # prompts in one hostile request: the gateway's MAX_PROMPTS


class BusyTenant:
    """A tenant that keeps requests in flight until stopped (`_wanted` says which to add when it runs short);
    `with` waits until it is as busy as it means to be (`_ready`) and cancels what is left on the way out."""

    prefix = "busy"

    def __init__(self, engine: Engine, tokens: int):
        self.engine, self.tokens = engine, tokens
        self.outstanding = 0
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ids = iter(range(10**9))
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _wanted(self) -> list[GenerateRequest]:
        raise NotImplementedError

    def _ready(self) -> bool:
        raise NotImplementedError

    def _sink(self, events) -> None:
        if any(isinstance(e, (Done, Error)) for e in events):
            with self.lock:
                self.outstanding -= 1

    def _run(self) -> None:
        while not self.stop.is_set():
            with self.lock:
                requests = self._wanted()
                self.outstanding += len(requests)
            for request in requests:
                self.engine.submit(self.engine.prepare(request), self._sink)
            time.sleep(0.01)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 120
        while not self._ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()
        for request_id in list(self.engine.by_id):
            if request_id.startswith(f"{self.prefix}-"):
                self.engine.cancel(request_id)
        deadline = time.monotonic() + 120
        while self.outstanding > 0 and time.monotonic() < deadline:
            time.sleep(0.05)


class Hostile(BusyTenant):
    """A tenant that keeps one to two 128-prompt requests in flight until stopped: every row busy, the rest
    waiting."""

    prefix = "hostile"

    def __init__(self, engine: Engine, tenant: str, tokens: int):
        super().__init__(engine, tokens)
        self.tenant = tenant

    def _wanted(self) -> list[GenerateRequest]:
        if self.outstanding >= BATCH:  # so 128 to 256 of its requests are in flight
            return []
        return [GenerateRequest(request_id=f"hostile-{next(self.ids)}", model="m", tenant=self.tenant,
                                prompt=f"Write a long story about river number {index}.",
                                params=SamplingParams(max_tokens=self.tokens, temperature=0.0, ignore_eos=True))
                for index in range(BATCH)]

    def _ready(self) -> bool:
        return self.outstanding >= BATCH  # its first request is queued


def probe(engine: Engine, tenant: str, index: int) -> tuple[float, int]:
    """Seconds, and engine steps, from submit to the first token of one one-token request."""
    first = threading.Event()

    def sink(events) -> None:
        if any(isinstance(e, (Token, Error)) for e in events):
            first.set()

    request = GenerateRequest(request_id=f"quiet-{tenant}-{index}-{time.monotonic_ns()}", model="m", tenant=tenant,
                              prompt="Say hello.", params=SamplingParams(max_tokens=1, temperature=0.0))
    started, steps = time.perf_counter(), engine.steps
    engine.submit(engine.prepare(request), sink)
    if not first.wait(900):
        raise TimeoutError("a quiet request got no token in 900 s")
    return time.perf_counter() - started, engine.steps - steps


def phase(engine: Engine, probes: int, quiet_tenant: str) -> list[tuple[float, int]]:
    results = []
    for index in range(probes):
        results.append(probe(engine, quiet_tenant, index))
        time.sleep(0.02)
    print(f"  {probes} probes as {quiet_tenant!r}: p99 {percentile([s for s, _ in results], 0.99) * 1000:.1f} ms, "
          f"{percentile([n for _, n in results], 0.99)} steps, load {os.getloadavg()[0]:.1f}", flush=True)
    return results


# each attack of the second round: its script and the arguments that pick it
ATTACKS = {"admission": ("bench/attacks/worker_admission.py", []),
           "rows": ("bench/attacks/worker_fairness.py", ["--attacks", "rows"]),
           "grammar": ("bench/attacks/worker_fairness.py", ["--attacks", "grammar"]),
           "answers": ("bench/attacks/worker_fairness.py", ["--attacks", "answers"]),
           "bodies": ("bench/attacks/edge.py", [])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", default=os.environ.get("SLUICE_BENCH_QUICK") == "1")
    parser.add_argument("--rows", type=int, default=16, help="the engine's max_batch_size")
    parser.add_argument("--probes", type=int, default=None, help="quiet requests per phase")
    parser.add_argument("--hostile-tokens", type=int, default=None, help="new tokens of each hostile prompt")
    parser.add_argument("--attack", action="append", choices=[*ATTACKS, "all"], default=[],
                        help="also run this attack of the second round (repeatable)")
    parser.add_argument("--attacks-only", action="store_true", help="skip the hostile neighbour's phases")
    args = parser.parse_args()
    if not args.attacks_only:
        neighbour(args)
    for name in ATTACKS if "all" in args.attack else dict.fromkeys(args.attack):
        script, extra = ATTACKS[name]
        print(f"\n== attack {name}: {script} {' '.join(extra)}", flush=True)
        subprocess.run([sys.executable, str(REPO / script), *extra, *(["--quick"] if args.quick else [])],
                       check=True)


def neighbour(args: argparse.Namespace) -> None:
    """The hostile neighbour's phases: idle, fair turns, one FIFO queue."""
    probes = args.probes or (8 if args.quick else 30)
    hostile_tokens = args.hostile_tokens or (8 if args.quick else 32)

    os.environ.setdefault("SLUICE_MODEL_CACHE", str(REPO / ".data" / "test-model-cache"))
    torch.set_num_threads(1)
    loaded = load_model(ModelConfig(dtype="float32"), REPO / ".bench" / "worker")
    engine = Engine(loaded, ModelConfig(dtype="float32", max_batch_size=args.rows, max_context=512,
                                        max_queue=4 * BATCH + args.rows))
    engine.start()
    freeze_what_lives_on()  # as a worker does once started
    print(f"SmolLM2-135M float32, {args.rows} rows; hostile: {BATCH}-prompt requests of {hostile_tokens} tokens "
          f"kept waiting; {probes} quiet one-token probes per phase; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores")
    results: dict[str, list[tuple[float, int]]] = {}
    try:
        phase(engine, 2, "quiet")  # warm-up
        results["idle"] = phase(engine, probes, "quiet")
        with Hostile(engine, "hostile", hostile_tokens):
            results["hostile, fair turns"] = phase(engine, probes, "quiet")
        with Hostile(engine, "shared", hostile_tokens):
            # each probe waits behind one or two whole hostile requests here: a few show it
            results["hostile, one queue (FIFO)"] = phase(engine, max(2, probes // 5), "shared")
    finally:
        engine.stop()
    idle = percentile([s for s, _ in results["idle"]], 0.99)
    print(f"\n{'quiet tenant TTFT':<28} {'p50 ms':>9} {'p99 ms':>9} {'p99 / idle':>11} {'p99 steps':>10}")
    for name, measured in results.items():
        times = [s for s, _ in measured]
        print(f"{name:<28} {statistics.median(times) * 1000:>9.1f} {percentile(times, 0.99) * 1000:>9.1f} "
              f"{percentile(times, 0.99) / idle:>10.2f}x {percentile([n for _, n in measured], 0.99):>10}")
    print(f"\nbar: hostile, fair turns p99 within 2x of idle. Steps: engine steps from submit to the first token, a\n"
          f"measure the machine's load does not change. Rows parked for the quiet tenant: "
          f"{engine.scheduler.preemptions}.")


if __name__ == "__main__":
    main()
