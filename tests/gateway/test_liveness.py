"""`GET /livez` is the load balancer's and ECS's health path: 200 while the gateway runs, whatever its endpoints
do; `/health` stays readiness. A gateway whose only endpoint has no reachable worker (an ECS service still
starting, a missing weights prefix) is alive but not ready, and must not be replaced for it."""

from __future__ import annotations

import httpx

from testkit.servers import free_port
from testkit.sluice import start_sluice


def test_livez_answers_200_while_no_endpoint_is_ready(tmp_path):
    dead = free_port()  # nothing listens here: the endpoint's one replica never becomes ready
    config = (f'[[models]]\nname = "cold-model"\n'
              f'provisioner = {{ kind = "static", urls = ["http://127.0.0.1:{dead}"] }}\n')
    admin_key = "operator-admin-key-from-secrets-manager-0123456789"
    server = start_sluice(tmp_path / "data", config=config, wait=False, env={"SLUICE_ADMIN_KEY": admin_key})
    try:
        live = server.wait_alive()
        assert live.json() == {"status": "alive"}
        ready = httpx.get(f"{server.url}/health", timeout=30)
        assert ready.status_code == 503 and "cold-model" not in ready.text  # honest, and names nothing to anyone
        detail = httpx.get(f"{server.url}/health", headers={"authorization": f"Bearer {admin_key}"}, timeout=30)
        assert detail.status_code == 503 and "cold-model" in detail.json()["reason"]
    finally:
        server.stop()
