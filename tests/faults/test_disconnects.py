"""Clients that leave mid-stream: a seeded random 10% of the requests cut their connection after a few
events of a long stream. Each cut request is recorded exactly once, as cancelled, and its worker row is freed
(the stub saw
the gateway hang up); every other request completes. SLUICE_DISCONNECT_REQUESTS=10000 is the full run."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter

import pytest

from testkit.admin import wait_for_records
from testkit.protocol_worker import worker_process
from testkit.stub_gateway import host_port, sluice_on_worker_process
from tests.faults.load import Outcome, stream_completion

pytestmark = pytest.mark.slow
REQUESTS = int(os.environ.get("SLUICE_DISCONNECT_REQUESTS", "600"))
CONCURRENCY = 64
TOKENS = 64
LONG = 20_000


async def run(host: str, port: int, key: str, plan: list[int | None]) -> list[Outcome]:
    todo = iter(plan)
    outcomes: list[Outcome] = []

    async def client() -> None:
        for cut in todo:
            # a stream to be cut is long, so the client surely leaves before the worker finishes it, however
            # far the client lags behind what the gateway already wrote into its socket
            tokens = TOKENS if cut is None else LONG
            outcomes.append(await stream_completion(host, port, key, max_tokens=tokens, cut_after_events=cut))

    await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    return outcomes


def test_a_tenth_of_the_clients_leave_mid_stream(tmp_path):
    chooser = random.Random(19)
    plan = [chooser.randint(2, 16) if chooser.random() < 0.1 else None for _ in range(REQUESTS)]
    with worker_process(token_delay=0.02) as stub, sluice_on_worker_process(tmp_path / "gw", stub) as server:
        host, port = host_port(server)
        started = time.monotonic()
        outcomes = asyncio.run(run(host, port, server.api_key, plan))
        elapsed = time.monotonic() - started
        records = wait_for_records(server, REQUESTS, timeout=120)
        deadline = time.monotonic() + 120
        while (stats := stub.stats())["running"] and time.monotonic() < deadline:
            time.sleep(0.2)
    cut = [o for o in outcomes if o.cut]
    whole = [o for o in outcomes if not o.cut]
    print(f"\ndisconnects: {len(outcomes)} requests in {elapsed:.1f} s ({len(outcomes) / elapsed:.1f}/s), "
          f"{len(cut)} cut; stub { {k: v for k, v in stats.items() if k != 'cancelled_ids'} }")
    assert len(outcomes) == REQUESTS and len(cut) == sum(c is not None for c in plan)
    assert all(o.status == 200 and o.done and o.events == TOKENS + 2 for o in whole)
    assert all(o.status == 200 and o.request_id for o in cut)
    by_id = Counter(r["request_id"] for r in records)
    assert len(records) == REQUESTS and set(by_id.values()) == {1}  # one record each, none twice
    status = {r["request_id"]: r["status"] for r in records}
    assert [(o.events, status[o.request_id]) for o in cut if status[o.request_id] != "cancelled"] == []
    assert {status[o.request_id] for o in whole} == {"ok"}
    # every cut stream's worker row was freed: the worker saw the cancel, nothing is left running
    assert stats["running"] == 0
    assert sorted(stats["cancelled_ids"]) == sorted(f"{o.request_id}-0" for o in cut)
    assert stats["finished"] == len(whole)
