"""The `fleet` fixture: three real gateways in front of one played ECS worker service (tests/fleet/fleet.py)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from unittest import mock

import pytest
import redis as redis_client

from testkit.admin import default_team_key
from testkit.databases import create_database
from testkit.local_aws import moto_server
from testkit.played_ecs import PlayedEcs, ecs_service, manual_task_states, provisioner_toml
from testkit.protocol_worker import MODEL
from tests.fleet.fleet import AWS_ENV, Fleet, task_worker


@pytest.fixture
def moto_ecs(monkeypatch):
    """(moto URL, ECS client) of one service whose tasks the test plays, with the test credentials set."""
    for name, value in AWS_ENV.items():
        monkeypatch.setenv(name, value)
    with moto_server() as url:
        manual_task_states(url)
        with ecs_service(url) as (ecs, _):
            yield url, ecs


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, postgres, redis) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    database = asyncio.run(create_database(postgres.url, "fleet"))
    address_map, throttle_file = root / "addresses.json", root / "throttle"
    shared = redis_client.Redis.from_url(redis.url)
    with mock.patch.dict(os.environ, AWS_ENV), moto_server() as moto_url:
        manual_task_states(moto_url)
        with ecs_service(moto_url) as (ecs, network), \
                PlayedEcs(ecs, network, task_worker, address_map=address_map, surplus_grace_s=3.0) as played:
            played.busy = lambda worker: worker.handle.streaming
            config = f'''database_url = "{database}"
redis_url = "{redis.url}"

[scaling]
stable_window_seconds = 4
panic_window_seconds = 1
tick_seconds = 0.1
health_interval_seconds = 0.2
standby_worker = false

[[models]]
name = "{MODEL}"
min_replicas = 0
max_replicas = 3
target_concurrency = 3
idle_seconds = 4
drain_seconds = 10
max_wait_seconds = 60

''' + provisioner_toml(moto_url, address_map, throttle_file)
            fleet = Fleet(config, root, played, shared, throttle_file)
            try:
                fleet.start(0)  # first alone: it runs the migrations and holds the lease
                fleet.start(1, 2)
                fleet.api_key = default_team_key(fleet.gateways[0], "fleet")
                yield fleet
            finally:
                for gateway in fleet.gateways:
                    if gateway is not None:
                        gateway.stop(signal.SIGKILL)
                fleet.save_output()
    shared.close()

