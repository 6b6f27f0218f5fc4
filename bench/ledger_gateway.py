"""Requests per second through the real gateway with the usage ledger on vs off, in one run.

    .venv/bin/python bench/ledger_gateway.py [--requests N] [--concurrency C] [--rounds R] [--database-url URL]

One real worker (SmolLM2-135M) serves two `sluice serve` processes that differ only in the usage ledger:
the "off" one runs with the bench-only variable SLUICE_BENCH_NO_LEDGER=1 (no setting can turn billing off).
Requests are non-streamed completions with `max_tokens=1`, so the gateway's own per-request work (auth,
limits, proxy, render, and the durable ledger record) is a large share of the time. Rounds alternate on/off
so machine noise hits both; the median of each side is reported.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from testkit.servers import free_port
from testkit.sluice import MODEL, MODEL_CACHE, REPO, start_sluice

ADMIN_KEY = "bench-ledger-gateway-admin-key-0123456789"


def start_worker(data_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "SLUICE_MODEL_CACHE": str(MODEL_CACHE)}
    process = subprocess.Popen([sys.executable, "-m", "worker", "--port", str(port), "--data-dir", str(data_dir),
                                "--model-json", '{"max_batch_size": 32}'], cwd=REPO, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit("the worker exited while starting")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("the worker did not become healthy")


def gateway(data_dir: Path, worker: str, ledger: bool, database_url: str):
    config = "log_format = \"json\"\n"
    config += "default_team_limits = {}\n"  # measures the ledger, not the default team's rate limits
    if database_url:
        config += f'database_url = "{database_url}"\n'
    config += f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker}"] }}\n'
    env = {"SLUICE_ADMIN_KEY": ADMIN_KEY, **({} if ledger else {"SLUICE_BENCH_NO_LEDGER": "1"})}
    return start_sluice(data_dir, config=config, env=env)


async def drive(url: str, key: str, n: int, concurrency: int) -> float:
    """Requests per second for n requests, `concurrency` at a time."""
    body = {"model": MODEL, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
    counter = iter(range(n))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits,
                                 headers={"authorization": f"Bearer {key}"}) as client:
        async def one_client() -> None:
            for _ in counter:
                response = await client.post("/v1/completions", json=body)
                if response.status_code != 200:
                    raise SystemExit(f"request failed: {response.status_code} {response.text}")

        started = time.perf_counter()
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        return n / (time.perf_counter() - started)


def api_key(server, fallback) -> str:
    try:
        return server.api_key
    except LookupError:  # a shared database bootstraps its first key once, in the first gateway
        return fallback.api_key


async def bench(args: argparse.Namespace, on, off) -> None:
    servers = {"on": on, "off": off}
    keys = {"on": on.api_key, "off": api_key(off, on)}
    for name, server in servers.items():
        await drive(server.url, keys[name], min(50, args.requests), args.concurrency)  # warm up
    rates: dict[str, list[float]] = {"on": [], "off": []}
    for round_ in range(args.rounds):
        order = ("on", "off") if round_ % 2 == 0 else ("off", "on")
        for name in order:
            rate = await drive(servers[name].url, keys[name], args.requests, args.concurrency)
            rates[name].append(rate)
            print(f"round {round_ + 1} ledger {name:3}: {rate:8.1f} req/s", flush=True)
    on_rate, off_rate = statistics.median(rates["on"]), statistics.median(rates["off"])
    print(f"\nmedian ledger on : {on_rate:8.1f} req/s")
    print(f"median ledger off: {off_rate:8.1f} req/s")
    print(f"ratio on/off     : {on_rate / off_rate:8.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=300, help="requests per round and side")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--database-url", default="", help="postgresql://... (default: SQLite in each data dir)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-ledger-gw-") as tmp:
        root = Path(tmp)
        worker, url = start_worker(root / "worker")
        on = off = None
        try:
            on = gateway(root / "on", url, True, args.database_url)
            off = gateway(root / "off", url, False, args.database_url)
            asyncio.run(bench(args, on, off))
        finally:
            for server in (on, off):
                if server is not None:
                    server.stop()
            worker.terminate()
            worker.wait(timeout=30)


if __name__ == "__main__":
    main()
