"""Which ASGI server fronts the gateway: uvicorn (uvloop + httptools) vs granian, same app, same client.

Serves a small Litestar app shaped like the gateway's hot paths (a JSON reply and a 32-event SSE
stream) under each server in turn, and drives both with the same keep-alive async client in this
process. Prints requests/s and p50/p99 latency, and the ratio granian/uvicorn.

    .venv/bin/python bench/asgi_server.py [--requests 4000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

APP = '''
from litestar import Litestar, get
from litestar.response import Stream

@get("/json")
async def reply() -> dict:
    return {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "hello world"}]}

async def events():
    for i in range(32):
        yield b'data: {"choices":[{"index":0,"text":" tok"}]}\\n\\n'
    yield b"data: [DONE]\\n\\n"

@get("/stream")
async def stream() -> Stream:
    return Stream(events(), media_type="text/event-stream")

app = Litestar([reply, stream])
'''


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(server: str, port: int, workdir: Path) -> subprocess.Popen:
    (workdir / "bench_asgi_app.py").write_text(APP)
    if server == "uvicorn":
        command = [sys.executable, "-m", "uvicorn", "bench_asgi_app:app", "--port", str(port), "--loop", "uvloop",
                   "--http", "httptools", "--log-level", "warning", "--no-access-log"]
    else:
        command = [sys.executable, "-m", "granian", "--interface", "asgi", "--port", str(port), "--workers", "1",
                   "--log-level", "warning", "--no-ws", "bench_asgi_app:app"]
    return subprocess.Popen(command, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def drive(url: str, total: int, concurrency: int) -> list[float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        queue = iter(range(total))

        async def loop():
            for _ in queue:
                started = time.perf_counter()
                response = await client.get(url)
                await response.aread()
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(loop() for _ in range(concurrency)))
    return latencies


def measure(server: str, path: str, total: int, concurrency: int, workdir: Path) -> tuple[float, float, float]:
    port = free_port()
    process = start(server, port, workdir)
    try:
        url = f"http://127.0.0.1:{port}{path}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        asyncio.run(drive(url, 200, concurrency))  # warm-up
        started = time.perf_counter()
        latencies = asyncio.run(drive(url, total, concurrency))
        elapsed = time.perf_counter() - started
        latencies.sort()
        return total / elapsed, statistics.median(latencies) * 1000, latencies[int(len(latencies) * 0.99)] * 1000
    finally:
        process.terminate()
        process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    workdir = Path(__file__).resolve().parents[1] / ".bench" / "asgi"
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.requests} requests, concurrency {args.concurrency}")
    print(f"{'route':8} {'server':8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for path in ("/json", "/stream"):
        results = {}
        for server in ("uvicorn", "granian"):
            results[server] = measure(server, path, args.requests, args.concurrency, workdir)
            rps, p50, p99 = results[server]
            print(f"{path:8} {server:8} {rps:9.0f} {p50:8.2f} {p99:8.2f}")
        print(f"{path:8} granian/uvicorn throughput ratio: {results['granian'][0] / results['uvicorn'][0]:.2f}")


if __name__ == "__main__":
    main()
