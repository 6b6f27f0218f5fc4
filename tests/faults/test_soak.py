"""Soak: many concurrent streaming clients against a real gateway and a stub worker streaming 64 tokens.

No 5xx, the gateway's memory flat after warm-up (< 10% growth), no descriptor growth, one ledger record per
request. The default run is sized for CI; SLUICE_SOAK_CLIENTS=1000 SLUICE_SOAK_SECONDS=600 is the full soak.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter

import pytest

from testkit.admin import wait_for_records
from testkit.protocol_worker import worker_process
from testkit.stub_gateway import footprint, host_port, sluice_on_worker_process
from tests.faults.load import Outcome, stream_completion

pytestmark = pytest.mark.slow
CLIENTS = int(os.environ.get("SLUICE_SOAK_CLIENTS", "100"))
SECONDS = float(os.environ.get("SLUICE_SOAK_SECONDS", "30"))
WARMUP = max(5.0, SECONDS * 0.2)
TOKENS = 64


async def soak(host: str, port: int, key: str, server) -> tuple[list[Outcome], list[tuple[float, int, int]]]:
    outcomes: list[Outcome] = []
    samples: list[tuple[float, int, int]] = []  # (seconds since start, rss, fds)
    started = time.monotonic()
    stop_at = started + WARMUP + SECONDS

    async def client() -> None:
        while time.monotonic() < stop_at:
            outcomes.append(await stream_completion(host, port, key, max_tokens=TOKENS))

    async def sample() -> None:
        while time.monotonic() < stop_at:
            await asyncio.sleep(1.0)
            samples.append((time.monotonic() - started, *footprint(server)))

    await asyncio.gather(sample(), *(client() for _ in range(CLIENTS)))
    return outcomes, samples


def test_soak_streaming_clients(tmp_path):
    with worker_process(token_delay=0.01) as stub, sluice_on_worker_process(tmp_path / "gw", stub) as server:
        host, port = host_port(server)
        key = server.api_key
        idle_before = footprint(server)
        outcomes, samples = asyncio.run(soak(host, port, key, server))
        time.sleep(2.0)  # connections closing, keep-alive pool settling
        idle_after = footprint(server)
        statuses = Counter(o.status for o in outcomes)
        records = wait_for_records(server, len(outcomes), timeout=120)
        stats = stub.stats()
        flaps = server.log_events("replica_unhealthy") + server.log_events("replica_unreachable")
    steady = [s for s in samples if s[0] >= WARMUP]
    warm_rss = steady[0][1]
    peak_rss = max(s[1] for s in steady)
    rate = len(outcomes) / (WARMUP + SECONDS)
    print(f"\nsoak: {CLIENTS} clients, {WARMUP + SECONDS:.0f} s, {len(outcomes)} requests ({rate:.1f}/s), "
          f"statuses {dict(statuses)}; rss idle {idle_before[0] >> 20} MiB, after warm-up {warm_rss >> 20} MiB, "
          f"steady peak {peak_rss >> 20} MiB, idle after {idle_after[0] >> 20} MiB; fds idle {idle_before[1]}, "
          f"under load max {max(s[2] for s in samples)}, idle after {idle_after[1]}; "
          f"worker marked down {len(flaps)} times")
    assert flaps == [], flaps[:3]  # the worker was never taken for down (a keep-alive race did that once)
    assert statuses == {200: len(outcomes)}, ([o for o in outcomes if o.status != 200][:3], flaps[:3])
    assert all(o.done and o.events == TOKENS + 2 for o in outcomes)  # 64 tokens, the finish chunk, [DONE]
    assert peak_rss < warm_rss * 1.10
    # the gateway keeps up to 256 idle connections to the worker between loads; nothing else may stay open
    assert idle_after[1] <= idle_before[1] + min(CLIENTS, 256) + 4
    assert len(records) == len(outcomes)
    assert Counter(r["status"] for r in records) == {"ok": len(outcomes)}
    assert stats["started"] == stats["finished"] == len(outcomes) and stats["running"] == 0
