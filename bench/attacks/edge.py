"""Stalled request bodies: a quiet team's time to first token while a hostile team holds unfinished bodies.

    .venv/bin/python bench/attacks/edge.py [--quick] [--connections 100] [--stalled-mb 3.8] [--probes 40]

One real `sluice serve` in front of the protocol worker (testkit/protocol_worker.py: no model, a token every
millisecond), twice in the same run:
- bounded: the `[http]` defaults (`max_buffered_body_bytes` 64 MiB, 16 MiB per client);
- unbounded: the same gateway with those two bounds lifted (1 TiB), as the edge was before them.
On each, a quiet team streams `--probes` completions one after another and we take its TTFT (send -> first
token) p50 / p99, first idle, then while the hostile team's `--connections` connections (from as many
loopback addresses) each send a head announcing 4,000,000 bytes and `--stalled-mb` of body, then nothing.
Prints each phase, the ratio of the attacked p99 to the idle p99, the gateway's RSS growth under the attack,
and how many of the hostile connections the gateway cut (429 body_buffer_full). No assertions: the bar is the
quiet team's p99 within 2x of idle, and a bounded RSS growth.
`--quick` (or SLUICE_BENCH_QUICK=1) runs a small version for `make bench`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

# run as a script, this file's folder comes first on sys.path; the repository must be importable
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.harness.stats import percentile  # noqa: E402
from testkit.admin import admin  # noqa: E402
from testkit.protocol_worker import MODEL, worker_process  # noqa: E402
from testkit.sluice import SluiceServer, running_sluice  # noqa: E402

ADMIN_KEY = "bench-attacks-edge-admin-key-0123456789ab"
ANNOUNCED = 4_000_000
UNBOUNDED = "max_buffered_body_bytes = 1099511627776\nmax_buffered_body_bytes_per_client = 1099511627776\n"


def config(worker_url: str, bounded: bool) -> str:
    return (f'log_format = "json"\ndefault_team_limits = {{}}\n[http]\nbody_timeout_s = 600\n'
            f'{"" if bounded else UNBOUNDED}'
            f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker_url}"] }}\n')


def team_key(server: SluiceServer, name: str) -> str:
    team = admin(server, "POST", "/admin/teams", name=name)["id"]
    return admin(server, "POST", "/admin/keys", name=f"{name}-svc", team_id=team)["key"]


def ttft(client: httpx.Client, url: str, key: str) -> float:
    """Seconds from sending a streamed completion to its first token."""
    started = time.perf_counter()
    with client.stream("POST", f"{url}/v1/completions", headers={"authorization": f"Bearer {key}"},
                       json={"model": MODEL, "prompt": "hi", "max_tokens": 2, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and '"text"' in line:
                return time.perf_counter() - started
    raise RuntimeError(f"no token: {response.status_code}")


def probe(server: SluiceServer, key: str, count: int) -> list[float]:
    with httpx.Client(timeout=120, transport=httpx.HTTPTransport(local_address="127.0.9.1")) as client:
        ttft(client, server.url, key)  # a warm connection and route
        return [ttft(client, server.url, key) for _ in range(count)]


def stall(server: SluiceServer, key: str, index: int, size: int) -> socket.socket:
    head = (f"POST /v1/completions HTTP/1.1\r\nhost: sluice\r\nauthorization: Bearer {key}\r\n"
            f"content-type: application/json\r\ncontent-length: {ANNOUNCED}\r\n\r\n").encode()
    sock = socket.socket()
    sock.settimeout(30)
    sock.bind((f"127.0.{10 + index // 250}.{1 + index % 250}", 0))
    sock.connect(("127.0.0.1", int(server.url.rsplit(":", 1)[1])))
    with contextlib.suppress(OSError):  # cut while it sends: the gateway's bound at work
        sock.sendall(head + b" " * size)
    return sock


def cut(sock: socket.socket) -> bool:
    sock.settimeout(0.2)
    try:
        return sock.recv(64).startswith(b"HTTP/1.1 429")
    except TimeoutError:
        return False
    except OSError:
        return True


def phase(name: str, idle: list[float], attacked: list[float], growth_mib: float, cuts: int, total: int) -> None:
    idle_p99, attacked_p99 = percentile(idle, 0.99), percentile(attacked, 0.99)
    print(f"{name:>9}  idle p50 {percentile(idle, 0.5) * 1e3:7.1f} ms  p99 {idle_p99 * 1e3:7.1f} ms | attacked "
          f"p50 {percentile(attacked, 0.5) * 1e3:7.1f} ms  p99 {attacked_p99 * 1e3:7.1f} ms | p99 ratio "
          f"{attacked_p99 / idle_p99:5.2f}x | RSS +{growth_mib:6.1f} MiB | cut {cuts}/{total}", flush=True)


def run(bounded: bool, args: argparse.Namespace, worker_url: str) -> None:
    settings = config(worker_url, bounded)
    with tempfile.TemporaryDirectory() as data, \
            running_sluice(Path(data), config=settings, env={"SLUICE_ADMIN_KEY": ADMIN_KEY}) as server:
        quiet, hostile = team_key(server, "quiet"), team_key(server, "hostile")
        gateway = psutil.Process(server.process.pid)
        idle = probe(server, quiet, args.probes)
        before = gateway.memory_info().rss
        held = []
        try:
            for index in range(args.connections):
                held.append(stall(server, hostile, index, int(args.stalled_mb * 1e6)))
            growth = (gateway.memory_info().rss - before) / 2**20
            attacked = probe(server, quiet, args.probes)
            cuts = sum(cut(sock) for sock in held)
        finally:
            for sock in held:
                sock.close()
        phase("bounded" if bounded else "unbounded", idle, attacked, growth, cuts, len(held))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", default=os.environ.get("SLUICE_BENCH_QUICK") == "1")
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--stalled-mb", type=float, default=3.8)
    parser.add_argument("--probes", type=int, default=40)
    args = parser.parse_args()
    if args.quick:
        args.connections, args.probes = min(args.connections, 30), min(args.probes, 10)
    print(f"stalled bodies: {args.connections} connections x {args.stalled_mb} MB of a {ANNOUNCED / 1e6:g} MB body; "
          f"{args.probes} streamed probes of the quiet team per phase", flush=True)
    with worker_process(token_delay=0.001, quiet=True) as worker:
        for bounded in (True, False):
            run(bounded, args, worker.url)


if __name__ == "__main__":
    main()
