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

from testkit.admin import wait_for_records
from testkit.databases import fresh_database
from testkit.protocol_worker import worker_process
from testkit.servers import restarted_at_exit, take_down
from testkit.stub_gateway import host_port, sluice_on_worker_process
from tests.faults.outage import through_outage

pytestmark = pytest.mark.slow
CLIENTS = 16


async def usage_probes(server, answers: list[httpx.Response]) -> None:
    async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {server.api_key}"}) as usage:
        for _ in range(3):
            await asyncio.sleep(0.7)
            answers.append(await usage.get(f"{server.url}/v1/usage"))


async def test_postgres_killed_and_restarted_under_load(tmp_path, postgres):
    async with fresh_database(postgres, "auth") as url:
        with restarted_at_exit(postgres):
            with worker_process(token_delay=0.01) as stub, \
                    sluice_on_worker_process(tmp_path / "gw", stub, f'database_url = "{url}"') as server:
                usage_during: list[httpx.Response] = []
                host, port = host_port(server)
                run = await through_outage(host, port, server.api_key, clients=CLIENTS,
                                           take_down=lambda: take_down(postgres),
                                           away=lambda: usage_probes(server, usage_during), bring_back=postgres.start)
                waited = time.monotonic()
                records = await asyncio.to_thread(wait_for_records, server, len(run.outcomes), 120)
                caught_up_after = time.monotonic() - waited
    outcomes, by_phase = run.outcomes, run.by_phase()
    print(f"\npostgres outage: statuses by phase {by_phase}; usage API during the outage "
          f"{[r.status_code for r in usage_during]}; ledger complete {caught_up_after:.1f} s after the load ended")
    assert [o for _, o in outcomes if o.status != 200 or not o.done or o.error] == []
    assert by_phase["during"][200] > 0
    assert [r.status_code for r in usage_during] == [503] * 3
    assert all(r.json()["error"]["type"] == "service_unavailable" for r in usage_during), usage_during[0].text
    by_id = Counter(r["request_id"] for r in records)
    assert len(records) == len(outcomes) and set(by_id.values()) == {1}
    assert set(by_id) == {o.request_id for _, o in outcomes}
