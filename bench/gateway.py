"""Gateway overhead, Sluice vs LiteLLM, same box, same load generators, one run.

    .venv/bin/python bench/gateway.py [--quick] [--duration S] [--connections 8,32,128]
                                      [--rates 100,500,1000,2000] [--modes plain,stream] [--no-litellm]
                                      [--profiles embedded,postgres] [--gateway-processes 1,2]

Starts, each in its own process:
- a protocol stub worker (testkit/protocol_worker.py: answers at once with the worker protocol's NDJSON);
- `sluice serve` in front of it, once per profile and process count: the embedded profile (SQLite; with Redis for
  the limits when it runs 2+ processes) and the PostgreSQL + Redis profile (auth and ledger in PostgreSQL,
  limits in Redis, both started here); authentication, team limits (set high enough never to refuse) and the
  usage ledger on, called with an API key made by `sluice keys create`;
- an OpenAI-shaped stub (bench/harness/openai_stub.py) and LiteLLM (pinned 1.106, 2 workers, no database, a
  master key) in front of it, in its own venv under .bench/ (created on first run);
and drives each, and each stub alone, with POST chat completions: `wrk` closed loop at each connection count,
and the open-loop generator of bench/harness/open_loop.py at each rate. "plain" asks for 1 output token,
"stream" for 64 tokens streamed. Added latency is a gateway's latency minus its stub's alone in the same
setting; CPU ms per request comes from /proc of the gateway's processes (all LiteLLM workers included).
The Sluice targets are named `sluice` (embedded, one process), `sluice-pg` (PostgreSQL + Redis) and `-Np` for N
processes; the targets are for one process, and the run ends with each one-process variant judged against
them: its best non-streamed RPS against LiteLLM's best (>= 10x), the added p99 at 500 RPS open loop (<= 5 ms), and,
at the open-loop stream rate that offers 10,000 tokens/s (157 streams/s, always run), the relayed tokens per
CPU-second (>= 10,000) and the added p99 gap between a stream's reads (<= 1 ms).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec
import uvloop

from bench.harness.open_loop import run_open_loop
from bench.harness.processes import (
    REPO,
    cpu_seconds,
    ensure_litellm,
    ensure_wrk,
    process_tree,
    spawn,
    stop,
    wait_http,
    wait_idle,
)
from common.protocol import GenerateRequest, SamplingParams
from testkit.protocol_worker import worker_command
from testkit.servers import free_port, postgres_server, redis_server
from testkit.sluice import start_sluice

MODEL = "stub-model"
LITELLM_KEY = "sk-bench-litellm-master-key"
LUA = REPO / "bench" / "harness" / "chat.lua"
TOKENS = {"plain": 1, "stream": 64}
# the targets, for one gateway process, judged in `verdicts`
RPS_TIMES_LITELLM = 10.0  # non-streamed: the best closed-loop RPS, against LiteLLM's best
P99_RATE, ADDED_P99_MS = 500, 5.0  # non-streamed, open loop
TOKENS_PER_CPU_S, ADDED_GAP_MS = 10_000, 1.0  # streamed: relayed tokens per CPU-second, added p99 inter-token gap
STREAM_RATE = math.ceil(TOKENS_PER_CPU_S / TOKENS["stream"])  # streams/s that offer 10,000 tokens/s: 157


@dataclass
class Target:
    name: str
    port: int
    path: str
    key: str
    pids: list[int]  # whose CPU counts ([] for the stubs: they are the floor, not a gateway)
    body: dict[str, bytes]  # per mode

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Point:
    rps: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    errors: int
    cpu_ms: float  # per request; nan for a stub
    gap_p99_ms: float = float("nan")  # open loop, streamed: p99 gap between reads that carried events
    failures: str = ""  # open loop: what the errors were


def chat_body(mode: str) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": TOKENS[mode]}
    if mode == "stream":
        body["stream"] = True
    return json.dumps(body).encode()


def generate_body(mode: str) -> bytes:
    return msgspec.json.encode(GenerateRequest(request_id="bench", model=MODEL, prompt="Say hello",
                                               params=SamplingParams(max_tokens=TOKENS[mode])))


def create_key(data_dir: Path) -> str:
    """An API key of the default team, made the way an operator makes one (`sluice.toml` names the database)."""
    cli = [sys.executable, "-m", "gateway.cli.main", "--data-dir", str(data_dir),
           "--config", str(data_dir / "sluice.toml")]
    team = subprocess.run([*cli, "teams", "list", "--json"], cwd=REPO, check=True, capture_output=True,
                          text=True).stdout
    team_id = next(t["id"] for t in json.loads(team) if t["name"] == "default")
    made = subprocess.run([*cli, "keys", "create", "--name", "bench", "--team-id", team_id, "--json"], cwd=REPO,
                          check=True, capture_output=True, text=True).stdout
    return json.loads(made)["key"]


def sluice_config(worker: str, processes: int, redis_url: str, database_url: str = "") -> str:
    config = ('log_format = "json"\n'
              # limits stay on (every request is counted and checked) but never refuse during the bench
              "default_team_limits = { rpm = 100000000, tpm = 100000000000, max_concurrency = 100000 }\n"
              # the load generator is one address standing for many clients (as a load balancer would be)
              "http = { max_connections_per_client = 0 }\n"
              f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker}"] }}\n')
    if redis_url:  # the processes share the limits through Redis (the PostgreSQL profile's limits live there too)
        config = f'redis_url = "{redis_url}"\n' + config
    if database_url:
        config = f'database_url = "{database_url}"\n' + config
    return f"gateway_processes = {processes}\n" + config


def variant_name(profile: str, processes: int) -> str:
    return "sluice" + ("-pg" if profile == "postgres" else "") + (f"-{processes}p" if processes > 1 else "")


def litellm_config(upstream: str) -> str:
    return (f"model_list:\n  - model_name: {MODEL}\n    litellm_params:\n      model: openai/{MODEL}\n"
            f"      api_base: {upstream}/v1\n      api_key: stub\n"
            f"general_settings:\n  master_key: {LITELLM_KEY}\n"
            "litellm_settings:\n  drop_params: true\n  set_verbose: false\n")


def run_wrk(wrk: str, target: Target, mode: str, connections: int, duration: float) -> Point:
    env = {**os.environ, "BENCH_PATH": target.path, "BENCH_BODY": target.body[mode].decode(),
           "BENCH_AUTH": target.key}
    before = cpu_seconds(target.pids)
    out = subprocess.run([wrk, "-t", str(min(2, connections)), "-c", str(connections), "-d", f"{duration:g}s",
                          "--timeout", "30s", "-s", str(LUA), target.url], env=env, capture_output=True, text=True,
                         check=True).stdout
    spent = cpu_seconds(target.pids) - before
    line = next(line for line in out.splitlines() if line.startswith("BENCH "))
    stats = json.loads(line[len("BENCH "):])
    ok = stats["requests"] - stats["non2xx"]
    scale = 1e3 if ok else float("nan")  # no answer finished inside the window: no latency to show
    return Point(rps=ok / (stats["duration_us"] / 1e6), p50_ms=stats["p50"] / scale, p99_ms=stats["p99"] / scale,
                 p999_ms=stats["p999"] / scale, errors=stats["non2xx"] + stats["socket_errors"],
                 cpu_ms=1000 * spent / ok if target.pids and ok else float("nan"))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_open(target: Target, mode: str, rate: int, duration: float) -> Point:
    before = cpu_seconds(target.pids)
    # no collector pauses of the generator's own inside a point: they were 15-37 ms, each delaying a run of
    # requests in the tail of whichever target was measured then; what the point allocated is freed after it
    gc.collect()
    gc.disable()
    try:
        result = uvloop.run(run_open_loop("127.0.0.1", target.port, target.path, target.body[mode], target.key,
                                          rate, duration))
    finally:
        gc.enable()
    spent = cpu_seconds(target.pids) - before
    ms = [1000 * s for s in result.latencies_s]
    return Point(rps=result.rps, p50_ms=percentile(ms, 0.5), p99_ms=percentile(ms, 0.99),
                 p999_ms=percentile(ms, 0.999), errors=result.errors,
                 cpu_ms=1000 * spent / result.ok if target.pids and result.ok else float("nan"),
                 gap_p99_ms=1000 * percentile(result.gaps_s, 0.99),
                 failures=", ".join(f"{count} {what}" for what, count in result.failures.most_common()))


def ratio(ours: float, theirs: float) -> str:
    if math.isnan(theirs) or math.isnan(ours) or theirs == 0:
        return "   -"
    return f"{ours / theirs:6.2f}x"


def report(title: str, settings: list, points: dict[tuple, Point], mode: str, have_litellm: bool) -> None:
    print(f"\n## {title}, {mode} ({TOKENS[mode]} token{'s' if TOKENS[mode] > 1 else ''})")
    print(f"{'setting':>8} {'target':<9} {'RPS':>8} {'p50':>8} {'p99':>8} {'p99.9':>8} {'+p50':>7} {'+p99':>7} "
          f"{'+p99.9':>7} {'cpu/req':>8} {'gap p99':>8} {'err':>5}")
    for setting in settings:
        sluices = sorted({name for name, _, _ in points if name.startswith("sluice")}, key=len)
        for name, stub in (("stub", None), *((n, "stub") for n in sluices), ("openai", None), ("litellm", "openai")):
            point = points.get((name, mode, setting))
            if point is None:
                continue
            floor = points.get((stub, mode, setting)) if stub else None
            added = [(getattr(point, f) - getattr(floor, f)) if floor else float("nan")
                     for f in ("p50_ms", "p99_ms", "p999_ms")]
            print(f"{setting:>8} {name:<9} {point.rps:8.0f} {point.p50_ms:8.2f} {point.p99_ms:8.2f} "
                  f"{point.p999_ms:8.2f} {added[0]:7.2f} {added[1]:7.2f} {added[2]:7.2f} {point.cpu_ms:8.2f} "
                  f"{point.gap_p99_ms if mode == 'stream' else float('nan'):8.2f} {point.errors:5d}"
                  + (f"  ({point.failures})" if point.failures else ""))
        for name in sluices:
            ours, theirs = points.get((name, mode, setting)), points.get(("litellm", mode, setting))
            if ours and theirs and have_litellm:
                stub, upstream = points[("stub", mode, setting)], points[("openai", mode, setting)]
                print(f"{setting:>8} {'ratio':<9} RPS {name}/litellm {ratio(ours.rps, theirs.rps)}, added p50 "
                      f"{ratio(ours.p50_ms - stub.p50_ms, theirs.p50_ms - upstream.p50_ms)}, added p99 "
                      f"{ratio(ours.p99_ms - stub.p99_ms, theirs.p99_ms - upstream.p99_ms)}, added p99.9 "
                      f"{ratio(ours.p999_ms - stub.p999_ms, theirs.p999_ms - upstream.p999_ms)}, CPU/request "
                      f"{ratio(ours.cpu_ms, theirs.cpu_ms)}")


def verdicts(closed: dict[tuple, Point], opened: dict[tuple, Point]) -> None:
    """Each one-process Sluice variant against the targets, from this run's points."""
    print("\n## targets: one gateway process, this run")
    one_process = {n for n, _, _ in closed | opened if n.startswith("sluice") and not re.search(r"-\d+p$", n)}
    for name in sorted(one_process, key=len):
        for target, value, met in _judged(name, closed, opened):
            print(f"{name:<9} {target:<62} {value:<38} {'met' if met else 'NOT MET' if met is False else '-'}")


def _judged(name: str, closed: dict[tuple, Point], opened: dict[tuple, Point]) -> list[tuple[str, str, bool | None]]:
    def best(who: str) -> float:  # the most a target sustained without errors, over the connection counts
        return max((p.rps for (n, mode, _), p in closed.items() if n == who and mode == "plain" and not p.errors),
                   default=float("nan"))

    judged = []
    ours, theirs = best(name), best("litellm")
    measured = not math.isnan(theirs)
    judged.append((f"non-streamed RPS >= {RPS_TIMES_LITELLM:g}x LiteLLM's (best closed loop each)",
                   f"{ours:.0f} / {theirs:.0f} = {ours / theirs:.1f}x" if measured else "no LiteLLM in this run",
                   ours / theirs >= RPS_TIMES_LITELLM if measured else None))
    point, stub = opened.get((name, "plain", P99_RATE)), opened.get(("stub", "plain", P99_RATE))
    added = point.p99_ms - stub.p99_ms if point and stub and not point.errors else float("nan")
    judged.append((f"added p99 at {P99_RATE} RPS open loop, non-streamed <= {ADDED_P99_MS:g} ms",
                   f"{added:.2f} ms" if point else "not measured", added <= ADDED_P99_MS if point else None))
    point, stub = opened.get((name, "stream", STREAM_RATE)), opened.get(("stub", "stream", STREAM_RATE))
    kept_up = point is not None and not point.errors and point.rps >= 0.95 * STREAM_RATE
    tokens = TOKENS["stream"] * 1000 / point.cpu_ms if point else float("nan")
    judged.append((f"relayed tokens per CPU-second at {STREAM_RATE} streams/s >= {TOKENS_PER_CPU_S:,}",
                   f"{tokens:,.0f} ({point.rps:.0f} of {STREAM_RATE} streams/s served)" if point else "not measured",
                   kept_up and tokens >= TOKENS_PER_CPU_S if point else None))
    gap = point.gap_p99_ms - stub.gap_p99_ms if point and stub else float("nan")
    judged.append((f"added p99 inter-token gap at {STREAM_RATE} streams/s <= {ADDED_GAP_MS:g} ms",
                   f"{gap:.2f} ms ({point.gap_p99_ms:.2f} - stub's {stub.gap_p99_ms:.2f})" if point and stub
                   else "not measured", kept_up and gap <= ADDED_GAP_MS if point and stub else None))
    return judged


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 s per point, 8 and 32 connections, 100 and 500 RPS")
    parser.add_argument("--duration", type=float, help="seconds per measured point (10; --quick: 3)")
    parser.add_argument("--connections", help="wrk connection counts (8,32,128; --quick: 8,32)")
    parser.add_argument("--rates", help="open-loop request rates (100,500,1000,2000; --quick: 100,500)")
    parser.add_argument("--modes", default="plain,stream")
    parser.add_argument("--no-litellm", action="store_true", help="only the stubs and Sluice")
    parser.add_argument("--profiles", default="embedded,postgres", help="embedded (SQLite), postgres (+ Redis)")
    parser.add_argument("--gateway-processes", default="1", help="gateway_processes of sluice serve, e.g. 1,2")
    args = parser.parse_args()
    quick = {"duration": 3.0, "connections": "8,32", "rates": "100,500"}
    full = {"duration": 10.0, "connections": "8,32,128", "rates": "100,500,1000,2000"}
    for name, default in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    args.connections = [int(c) for c in args.connections.split(",") if c]
    args.rates = [int(r) for r in args.rates.split(",") if r]
    args.modes = [m for m in args.modes.split(",") if m]
    args.profiles = [p for p in args.profiles.split(",") if p]
    try:
        args.gateway_processes = [int(n) for n in args.gateway_processes.split(",") if n]
    except ValueError:
        parser.error("--gateway-processes takes counts, e.g. 1,2")
    if (any(m not in TOKENS for m in args.modes) or args.duration <= 0 or not args.gateway_processes
            or min(args.gateway_processes) < 1 or not args.profiles
            or any(p not in ("embedded", "postgres") for p in args.profiles)):
        parser.error("modes are plain and stream; profiles embedded and postgres; duration and processes positive")
    return args


def main() -> None:
    args = parse_args()
    wrk = ensure_wrk()
    litellm = None if args.no_litellm else ensure_litellm()
    started = []
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp, ExitStack() as servers:
        root = Path(tmp)
        try:
            stub_port, openai_port = free_port(), free_port()
            stub = spawn(worker_command(stub_port, MODEL, token_delay=0), root / "stub.log")
            started.append(stub)
            wait_http(f"http://127.0.0.1:{stub_port}/health", stub, root / "stub.log")
            openai = spawn([sys.executable, "-m", "bench.harness.openai_stub", "--port", str(openai_port)],
                           root / "openai.log")
            started.append(openai)
            wait_http(f"http://127.0.0.1:{openai_port}/health", openai, root / "openai.log")
            chat = {mode: chat_body(mode) for mode in TOKENS}
            targets = [Target("stub", stub_port, "/generate", "", [], {m: generate_body(m) for m in TOKENS})]
            sluices = []
            for profile in args.profiles:
                for processes in args.gateway_processes:
                    name = variant_name(profile, processes)
                    database_url = redis_url = ""
                    if profile == "postgres":
                        database_url = servers.enter_context(postgres_server()).url
                    if profile == "postgres" or processes > 1:
                        redis_url = servers.enter_context(redis_server()).url
                    sluice = start_sluice(root / name, config=sluice_config(f"http://127.0.0.1:{stub_port}",
                                                                            processes, redis_url, database_url))
                    started.append(sluice.process)
                    sluices.append(sluice)
                    while sluice.output.count("Sluice gateway listening") < processes:  # all serving first
                        time.sleep(0.2)
                    targets.append(Target(name, int(sluice.url.rsplit(":", 1)[1]), "/v1/chat/completions",
                                          create_key(root / name), process_tree(sluice.process.pid), chat))
            if litellm is not None:
                (root / "litellm.yaml").write_text(litellm_config(f"http://127.0.0.1:{openai_port}"))
                litellm_port = free_port()
                proxy = spawn([str(litellm), "--config", str(root / "litellm.yaml"), "--port", str(litellm_port),
                               "--num_workers", "2",
                               # on a busy box its import outlasts uvicorn's 5 s worker health check
                               "--timeout_worker_healthcheck", "120"], root / "litellm.log",
                              # no network for the price list: its bundled copy
                              env={"LITELLM_LOG": "ERROR", "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
                started.append(proxy)
                wait_http(f"http://127.0.0.1:{litellm_port}/health/liveliness", proxy, root / "litellm.log")
                targets += [Target("openai", openai_port, "/v1/chat/completions", "", [], chat),
                            Target("litellm", litellm_port, "/v1/chat/completions", LITELLM_KEY,
                                   process_tree(proxy.pid), chat)]
            for target in targets:  # warm up (LiteLLM's first requests take seconds), and fail loudly on a broken setup
                for _ in range(10):
                    point = run_wrk(wrk, target, "plain", 4, 3)
                    if point.rps > 0 and not point.errors:
                        break
                else:
                    raise SystemExit(f"bench: {target.name} did not answer cleanly while warming up: {point}")
            print(f"bench: {time.strftime('%H:%M:%S', time.gmtime())} UTC, {os.cpu_count()} cores, load average "
                  f"{os.getloadavg()[0]:.1f}, {args.duration:g} s per point, sluice profiles "
                  f"{','.join(args.profiles)}, gateway_processes {','.join(map(str, args.gateway_processes))}",
                  flush=True)
            closed: dict[tuple, Point] = {}
            opened: dict[tuple, Point] = {}
            for mode in args.modes:
                for connections in args.connections:
                    for target in targets:
                        closed[(target.name, mode, connections)] = run_wrk(wrk, target, mode, connections,
                                                                            args.duration)
                        wait_idle(target.pids)
                report("closed loop (wrk), connections", args.connections, closed, mode, litellm is not None)
                rates = sorted({*args.rates, STREAM_RATE}) if mode == "stream" else args.rates
                for rate in rates:
                    for target in targets:
                        opened[(target.name, mode, rate)] = run_open(target, mode, rate, args.duration)
                        wait_idle(target.pids)
                report("open loop (asyncio generator), offered RPS", rates, opened, mode, litellm is not None)
            verdicts(closed, opened)
            errors = Counter(event["error"] for sluice in sluices for event in sluice.log_events("request_done")
                             if event.get("error"))
            print(f"\nload average at the end {os.getloadavg()[0]:.1f}; latencies in ms, cpu in ms per request; "
                  f"Sluice's errors by code: {dict(errors) or 'none'}")
        finally:
            for process in reversed(started):
                stop(process)


if __name__ == "__main__":
    main()
