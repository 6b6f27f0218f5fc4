"""Shared by the endpoint tests: the service in the test's loop, one request through it, a poll for a
condition, and the answer of the named protocol workers (conftest's `named_workers`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from common.protocol import GenerateRequest, SamplingParams
from gateway.endpoints.scaling import ScalingSettings
from gateway.endpoints.service import Endpoints
from gateway.serving.worker_client import WorkerClient
from testkit.protocol_worker import tokens

FAST = ScalingSettings(stable_window_seconds=3, panic_window_seconds=1, tick_seconds=0.1, standby_worker=False,
                       health_interval_seconds=0.2)
ANSWER = "t0 t1 t2 t3 t4"  # what every named protocol worker answers: five tokens, then `length`
START_S = 180  # the longest a test waits for a worker to start (two shared cores, other suites running)


async def open_endpoints(tmp_path: Path, *specs, settings: ScalingSettings = FAST, **options) -> Endpoints:
    endpoints = await Endpoints.open(f"sqlite:///{tmp_path}/sluice.db", specs, tmp_path, settings, **options)
    await endpoints.start()
    return endpoints


def generate(index: int, tokens: int = 8) -> GenerateRequest:
    return GenerateRequest(request_id=f"req-{index}", model="tiny/llama", prompt="Hello there",
                           params=SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True), stream=True)


async def complete(endpoints: Endpoints, endpoint, index: int, tokens: int = 8, pause: float = 0.0):
    """One request through the activator and the worker client: (events, lease)."""
    deadline = time.monotonic() + START_S
    lease = await endpoint.activator.acquire(deadline)
    events = []
    async for event in WorkerClient(endpoints).stream(endpoint, lease, generate(index, tokens), deadline):
        events.append(event)
        if pause:
            await asyncio.sleep(pause)
    return events, lease


async def until(condition, timeout: float = START_S, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not hold within {timeout} s")
        await asyncio.sleep(0.05)


def answer(worker_id: str) -> list:
    """A named protocol worker's whole answer, its events stamped with its id."""
    return tokens(ANSWER, reason="length", worker_id=worker_id)
