"""PostgreSQL (the gateway's only database: keys, teams, ledger) killed and restarted under streaming load:
completions keep being served (keys already seen are trusted from the last answer while the database is
away), the usage API answers 503 (`service_unavailable`, OpenAI envelope) during the outage, and afterwards
the ledger holds every request exactly once."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
import pytest

from tests.auth.conftest import fresh_postgres_database
from tests.billing.test_postgres_outage import take_down
from tests.faults.conftest import gateway, host_port, stub_worker, wait_for_records
from tests.faults.load import Outcome, stream_completion

pytestmark = pytest.mark.slow
CLIENTS = 16


async def load_through_outage(server, postgres) -> tuple[list[tuple[str, Outcome]], list[httpx.Response], float]:
    host, port = host_port(server)
    key = server.api_key
    phase = "before"
    outcomes: list[tuple[str, Outcome]] = []
    usage_during: list[httpx.Response] = []
    stop = asyncio.Event()
    caught_up = 0.0

    async def client() -> None:
        while not stop.is_set():
            started_in = phase
            outcomes.append((started_in, await stream_completion(host, port, key, max_tokens=32)))

    async def conduct() -> None:
        nonlocal phase, caught_up
        await asyncio.sleep(1.5)
        await asyncio.to_thread(take_down, postgres)
        phase = "during"
        async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {key}"}) as usage:
            for _ in range(3):
                await asyncio.sleep(0.7)
                usage_during.append(await usage.get(f"{server.url}/v1/usage"))
        phase = "restarting"
        await asyncio.to_thread(postgres.start)
        phase = "after"
        restarted = time.monotonic()
        await asyncio.sleep(2.0)
        stop.set()
        caught_up = restarted

    await asyncio.gather(conduct(), *(client() for _ in range(CLIENTS)))
    return outcomes, usage_during, caught_up


async def test_postgres_killed_and_restarted_under_load(tmp_path, postgres):
    async with fresh_postgres_database(postgres) as url:
        try:
            with stub_worker(token_delay=0.01) as stub, \
                    gateway(tmp_path / "gw", stub, f'database_url = "{url}"') as server:
                outcomes, usage_during, restarted = await load_through_outage(server, postgres)
                records = await asyncio.to_thread(wait_for_records, server, len(outcomes), 120)
                caught_up_after = time.monotonic() - restarted
        finally:
            if postgres.process.poll() is not None:
                postgres.start()
    by_phase = {p: Counter(o.status for q, o in outcomes if q == p) for p in ("before", "during", "after")}
    print(f"\npostgres outage: statuses by phase {by_phase}; usage API during the outage "
          f"{[r.status_code for r in usage_during]}; ledger complete {caught_up_after:.1f} s after the restart")
    assert [o for _, o in outcomes if o.status != 200 or not o.done or o.error] == []
    assert by_phase["during"][200] > 0
    assert [r.status_code for r in usage_during] == [503] * 3
    assert all(r.json()["error"]["type"] == "service_unavailable" for r in usage_during), usage_during[0].text
    by_id = Counter(r["request_id"] for r in records)
    assert len(records) == len(outcomes) and set(by_id.values()) == {1}
    assert set(by_id) == {o.request_id for _, o in outcomes}
