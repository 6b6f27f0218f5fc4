"""A gateway that stops leaves its ECS services as they are: the embedded default (SQLite, no Redis), one gateway,
an ECS endpoint that keeps one task (`min_replicas = 1`). Before issue #32, SIGTERM lowered every ECS service's
desiredCount to 0 (and stopped its tasks): every deploy cold-started every model."""

from __future__ import annotations

import signal

from testkit.played_ecs import desired_count, provisioner_toml
from testkit.sluice import start_sluice
from tests.fleet.fleet import AWS_ENV, WAIT_S, until


def test_sigterm_leaves_the_ecs_service_running(moto_ecs, tmp_path):
    url, ecs = moto_ecs
    config = '''[[models]]
name = "org/model"
min_replicas = 1
max_replicas = 1

''' + provisioner_toml(url)
    # the task never gets a worker here: the endpoint stays `starting`, so /health is 503 by design
    gateway = start_sluice(tmp_path / "gateway", config=config, env=AWS_ENV, wait=False)
    try:
        until(lambda: desired_count(ecs) == 1, WAIT_S, "the gateway asking ECS for its one task")
        # the endpoint scales while the lifespan still opens: a SIGTERM before it is done is uvicorn's plain exit
        until(lambda: "gateway listening on" in gateway.output, WAIT_S, "the gateway's start-up")
        assert gateway.stop(signal.SIGTERM, timeout=WAIT_S) == 0
    finally:
        gateway.stop(signal.SIGKILL)
    assert desired_count(ecs) == 1, gateway.output[-3000:]  # the next gateway finds the task it left
