"""Clients that read one byte a second, or never read, while others stream normally: each stalled stream is
cut after `stream_write_timeout_s` (recorded as cancelled, its worker row freed), the gateway's memory does not
grow with what the stalled clients leave unread, and the other clients are served throughout.

Here the kernel cuts them (TCP_USER_TIMEOUT, set by `sluice serve` to the same timeout); the gateway's own
write timeout, for what gets past it, is tested in tests/gateway/test_write_timeout.py."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from testkit.admin import wait_for_records
from testkit.protocol_worker import worker_process
from testkit.stub_gateway import footprint, host_port, sluice_on_worker_process
from tests.faults.load import Outcome, stalled_client, stream_completion

pytestmark = pytest.mark.slow
# x 16 KiB: 32 MiB per stalled stream, 640 MiB for all twenty if the gateway buffered it. At 5 ms a token the
# worker needs over 10 s for one, so every stalled stream is still running when the gateway cuts it (the
# kernel's socket buffers take a few MiB before a write stalls, then the 2 s timeout)
STALLED_TOKENS = 2048
TOKEN_BYTES = 16384
TOKEN_DELAY_S = 0.005
NORMAL_TOKENS = 16
STALL_SECONDS = 12.0
RATES = [0] * 10 + [1] * 10  # bytes a second: never reading, and one byte a second


async def normal_readers(host: str, port: int, key: str, seconds: float) -> list[Outcome]:
    outcomes: list[Outcome] = []
    stop_at = time.monotonic() + seconds

    async def reader() -> None:
        while time.monotonic() < stop_at:
            outcomes.append(await stream_completion(host, port, key, max_tokens=NORMAL_TOKENS))

    await asyncio.gather(*(reader() for _ in range(8)))
    return outcomes


async def run(host: str, port: int, key: str) -> tuple[list[tuple[int, bool]], list[Outcome]]:
    stalled = [stalled_client(host, port, key, seconds=STALL_SECONDS, bytes_per_second=rate,
                              max_tokens=STALLED_TOKENS) for rate in RATES]
    *cut, normal = await asyncio.gather(*stalled, normal_readers(host, port, key, STALL_SECONDS))
    return cut, normal


def test_slow_and_silent_readers_are_cut_and_hold_nothing(tmp_path):
    with worker_process(token_delay=TOKEN_DELAY_S, token_bytes=TOKEN_BYTES) as stub, \
            sluice_on_worker_process(tmp_path / "gw", stub, "stream_write_timeout_s = 2.0") as server:
        host, port = host_port(server)
        # the same readers alone first: the memory they need is the baseline
        warm = asyncio.run(normal_readers(host, port, server.api_key, 4.0))
        before = footprint(server)
        stalled, normal = asyncio.run(run(host, port, server.api_key))
        after = footprint(server)
        records = wait_for_records(server, len(RATES) + len(warm) + len(normal))
        stats = stub.stats()
    growth = (after[0] - before[0]) >> 20
    print(f"\nslow readers: {len(RATES)} stalled clients (10 never reading, 10 at 1 byte/s), {len(normal)} normal "
          f"requests served meanwhile ({len(warm)} in the same time alone); gateway rss {before[0] >> 20} -> "
          f"{after[0] >> 20} MiB, fds {before[1]} -> {after[1]}")
    assert all(cut for _, cut in stalled)  # every stalled stream was ended by the gateway
    assert all(o.status == 200 and o.done and o.events == NORMAL_TOKENS + 2 for o in warm + normal)
    assert len(normal) >= 8
    assert growth < 32  # what the stalled clients left unread: 640 MiB
    statuses = Counter(r["status"] for r in records)
    assert statuses == {"ok": len(warm) + len(normal), "cancelled": len(RATES)}
    assert stats["cancelled"] == len(RATES) and stats["running"] == 0, stats
