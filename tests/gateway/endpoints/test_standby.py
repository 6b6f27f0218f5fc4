"""The standby spare over real worker processes (`python -m worker --standby`, the tiny random model): it
is imported ahead with the q4 forward's library loaded (and no grammar fork server, which waits for a structured
request), a waking
endpoint takes it, and the next spare is only spawned once the local workers are quiet, never beside the
replica it woke while it serves."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from gateway.endpoints.scaling import ScalingSettings
from gateway.endpoints.spec import parse_endpoint
from testkit.tiny_model import write_tiny_model
from tests.gateway.endpoints.helpers import START_S, open_endpoints, until
from worker.engine.native.build import LIBRARY, NativeUnavailable, compiler

pytestmark = pytest.mark.slow

STANDBY = ScalingSettings(stable_window_seconds=3, panic_window_seconds=1, tick_seconds=0.1,
                          health_interval_seconds=0.2, standby_worker=True)


def descendants(root: int) -> dict[int, str]:
    """pid -> command line of every process below `root`."""
    parents, commands = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            commands[int(entry)] = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        parents[int(entry)] = int(stat[stat.rfind(")") + 2:].split()[1])
    below, frontier = {}, [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in below:
                below[pid] = commands[pid]
                frontier.append(pid)
    return below


def native_forward_builds() -> bool:
    try:
        compiler()
    except NativeUnavailable:
        return False
    return True


def workers() -> list[int]:
    """This test's worker processes (the replica and any spare), not their own children, nor those of a `sluice
    serve` that another module of this test process keeps running (tests/conftest.py's shared server)."""
    below = descendants(os.getpid())
    elsewhere = {pid for server, command in below.items() if "gateway.cli.main" in command
                 for pid in descendants(server)}
    return [pid for pid, command in below.items() if " -m worker" in command and pid not in elsewhere]


async def test_the_spare_is_refilled_only_once_the_woken_replica_is_quiet(tmp_path):
    tiny = write_tiny_model(tmp_path / "tiny")
    spec = parse_endpoint({"name": "tiny/llama", "source": str(tiny), "threads": 1, "decode_threads": 1,
                           "max_batch_size": 8, "max_context": 256, "min_replicas": 0, "max_replicas": 1,
                           "idle_seconds": 600})
    endpoints = await open_endpoints(tmp_path, spec, settings=STANDBY)
    endpoints.standby.refill_delay_s = 0.2  # well before the replica it woke is done
    endpoint = endpoints.resolve("tiny/llama", None)
    try:
        await until(lambda: endpoints.standby.ready, what="the first spare's imports")
        [spare] = workers()
        # no grammar fork server: it waits for a structured request (worker/decoding/grammar/compiler.py)
        assert not any("forkserver" in command for command in descendants(spare).values())
        if native_forward_builds():  # and the q4 forward's library is loaded (built where its source changed)
            assert LIBRARY in Path(f"/proc/{spare}/maps").read_text()

        lease = await endpoint.activator.acquire(time.monotonic() + START_S)  # wakes the endpoint: takes the spare
        assert workers() == [spare]
        await asyncio.sleep(2.0)  # ten times the refill delay, while a request holds the replica
        assert workers() == [spare] and not endpoints.standby.ready

        lease.release()  # quiet: the next spare comes
        await until(lambda: endpoints.standby.ready, what="the refilled spare")
        assert len(workers()) == 2 and spare in workers()
    finally:
        await endpoints.drain_and_stop()
