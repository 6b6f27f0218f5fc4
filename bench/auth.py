"""Authenticated request overhead vs an unauthenticated route, measured in the same run.

    .venv/bin/python bench/auth.py [--requests N] [--rounds R]

Drives a Litestar app through direct ASGI calls (no network, no test client) so the key check is
a visible share of the request. Target: the key check adds < 50 µs per request on a warm cache.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and its name would shadow the auth package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from litestar import Litestar, Request, get  # noqa: E402

from auth import AuthService  # noqa: E402
from gateway.authentication.headers import client_address, team_header  # noqa: E402


def build_app(service: AuthService) -> Litestar:
    @get("/open")
    async def open_route() -> dict:
        return {"ok": True}

    @get("/headers")
    async def headers_route(request: Request) -> dict:
        # Same Request injection and header reads as /authed, without the key check.
        request.headers.get("authorization"), team_header(request.headers)
        client_address(request, service.clients)
        return {"ok": True, "team": "-"}

    @get("/authed")
    async def authed_route(request: Request) -> dict:
        principal = await service.authenticate(request.headers.get("authorization"), team_header(request.headers),
                                               client_address(request, service.clients))
        return {"ok": True, "team": principal.team_id}

    return Litestar([open_route, headers_route, authed_route])


async def asgi_get(app: Litestar, path: str, headers: list[tuple[bytes, bytes]]) -> int:
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "headers": headers,
             "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 80)}
    status = 0

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def time_per_call(fn, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await fn()
    return (time.perf_counter() - start) / n * 1e6


async def main(requests: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        service = await AuthService.open(f"sqlite:///{tmp}/auth.db", b"bench-pepper-0123456789abcdef",
                                         touch_interval=60.0)
        boot = await service.bootstrap(None)
        app = build_app(service)
        authorization = f"Bearer {boot.first_key}"
        headers = [(b"authorization", authorization.encode()), (b"host", b"bench")]
        plain = [(b"host", b"bench")]
        assert await asgi_get(app, "/authed", headers) == 200 and await asgi_get(app, "/open", plain) == 200

        async def check():
            await service.authenticate(authorization, None, "127.0.0.1")

        opened, read, authed, checks = [], [], [], []
        for _ in range(rounds):  # interleaved rounds, so drift hits every route alike
            opened.append(await time_per_call(lambda: asgi_get(app, "/open", plain), requests))
            read.append(await time_per_call(lambda: asgi_get(app, "/headers", headers), requests))
            authed.append(await time_per_call(lambda: asgi_get(app, "/authed", headers), requests))
            checks.append(await time_per_call(check, requests))
        await service.close()

    o, h = statistics.median(opened), statistics.median(read)
    a, c = statistics.median(authed), statistics.median(checks)
    print(f"requests per round: {requests}, rounds: {rounds} (medians, µs per request)")
    print(f"  unauthenticated route, no Request       {o:8.1f} µs")
    print(f"  unauthenticated route, same header reads{h:8.1f} µs")
    print(f"  authenticated route                     {a:8.1f} µs   (ratio to the first {a / o:.2f}x)")
    print(f"  key check added per request             {a - h:8.1f} µs   (authed - same header reads)")
    print(f"  AuthService.authenticate() alone        {c:8.1f} µs   (warm cache; target < 50 µs)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    asyncio.run(main(options.requests, options.rounds))
