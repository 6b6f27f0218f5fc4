"""The workers' engine series on the gateway's `/metrics` (issue #46, item 3: one registry, worker metrics too):
a real gateway app on a real worker process (SmolLM2) and two replicas that are down, one refusing connections
and one that accepts them and never answers. The series come from the `/load` answers the gateway already polls
(gateway/replicas/worker_metrics.py), so the dead replicas are left out and never slow or fail a scrape."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest

from gateway.config import Settings
from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from testkit import protocol_worker as scripted
from testkit.servers import free_port
from testkit.sluice import MODEL, standalone_worker
from tests.gateway.app_client import ADMIN_KEY, app_client

TOKEN = "worker-metrics-scrape-token-0123456789"
SCRAPE = {"authorization": f"Bearer {TOKEN}"}
SERIES = ("sluice_worker_requests_waiting", "sluice_worker_rows_running", "sluice_worker_max_rows",
          "sluice_worker_kv_cache_use", "sluice_worker_steps_total", "sluice_worker_step_seconds_total",
          "sluice_worker_prompt_tokens_total", "sluice_worker_generated_tokens_total")


@pytest.fixture(scope="module")
def smol_worker(tmp_path_factory):
    with standalone_worker(tmp_path_factory.mktemp("worker"), max_batch_size=4, worker_id="metrics-worker") as url:
        yield url


@pytest.fixture
def silent_url():
    """A replica that accepts connections and never answers (a hung worker)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def worker_series(scraped: dict[str, float], name: str) -> dict[str, float]:
    return {key: value for key, value in scraped.items() if key.startswith(name + "{")}


async def test_worker_series_after_a_generation(smol_worker, silent_url, tmp_path):
    worker = smol_worker
    refused = f"http://127.0.0.1:{free_port()}"
    endpoint = EndpointSpec(name=MODEL, provisioner=StaticProvisioning(urls=[worker, refused, silent_url]))
    settings = Settings(data_dir=str(tmp_path), models=[endpoint], admin_key=ADMIN_KEY, metrics_token=TOKEN)
    async with app_client(settings) as client:
        deadline = time.monotonic() + 120
        while (await client.get("/health")).status_code != 200:
            assert time.monotonic() < deadline, "the endpoint never became ready"
            await asyncio.sleep(0.1)
        answer = await client.post("/v1/completions", headers=client.key_headers,
                                   json={"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8,
                                         "temperature": 0})
        assert answer.status_code == 200, answer.text
        usage = answer.json()["usage"]
        labels = f'{{endpoint="{MODEL}",replica="{worker}"}}'
        while True:  # the next /load poll (every health_interval_seconds) carries the finished request
            scraped = await client.get("/metrics", headers=SCRAPE)
            assert scraped.status_code == 200, scraped.text
            values = samples(scraped.text)
            if values.get(f"sluice_worker_generated_tokens_total{labels}", 0) >= usage["completion_tokens"]:
                break
            assert time.monotonic() < deadline, [line for line in scraped.text.splitlines() if "worker" in line]
            await asyncio.sleep(0.1)
        for name in SERIES:  # one replica, the live one: the dead ones are left out
            assert list(worker_series(values, name)) == [f"{name}{labels}"], (name, scraped.text)
        assert values[f"sluice_worker_prompt_tokens_total{labels}"] >= usage["prompt_tokens"] > 0
        assert values[f"sluice_worker_steps_total{labels}"] > 0  # the warm-up's steps count too
        assert values[f"sluice_worker_step_seconds_total{labels}"] > 0
        assert values[f"sluice_worker_max_rows{labels}"] == 4
        assert 0 <= values[f"sluice_worker_kv_cache_use{labels}"] <= 1
        assert values[f"sluice_worker_requests_waiting{labels}"] >= 0
        # no tenant's data in any worker series' labels
        key = client.key_headers["authorization"].split()[-1]
        assert not any(key in line or "default" in line for line in scraped.text.splitlines() if "worker" in line)


async def test_a_replica_that_goes_down_leaves_the_scrape(tmp_path):
    """A ready replica whose worker stops: every scrape still answers 200, and its series go once the gateway's
    poll finds it down."""
    with contextlib.ExitStack() as running:
        worker = running.enter_context(scripted.protocol_worker())
        endpoint = EndpointSpec(name=scripted.MODEL, provisioner=StaticProvisioning(urls=[worker.url]))
        settings = Settings(data_dir=str(tmp_path), models=[endpoint], admin_key=ADMIN_KEY, metrics_token=TOKEN)
        async with app_client(settings) as client:
            series = f'sluice_worker_max_rows{{endpoint="{scripted.MODEL}",replica="{worker.url}"}}'
            deadline = time.monotonic() + 60
            while series not in samples((await client.get("/metrics", headers=SCRAPE)).text):
                assert time.monotonic() < deadline, "the replica's series never appeared"
                await asyncio.sleep(0.05)
            await asyncio.to_thread(running.close)  # the worker stops; the gateway's loop goes on meanwhile
            while True:
                scraped = await client.get("/metrics", headers=SCRAPE)
                assert scraped.status_code == 200, scraped.text
                if series not in samples(scraped.text):
                    break
                assert time.monotonic() < deadline, "a replica that is down kept its series"
                await asyncio.sleep(0.05)
