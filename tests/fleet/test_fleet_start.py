"""A gateway with ECS endpoints serves at once, whatever ECS answers: its endpoints' owners adopt the services in
their loops, backing off while ECS throttles, and a service that cannot be adopted fails its endpoint alone.

Before issue #50 a gateway's start made one DescribeServices per ECS endpoint inside the fleet's 2 calls/s budget
before it listened (50 endpoints: first `/livez` after 64.5 s), one ThrottlingException there was exit 1, and one
deleted ECS service kept every gateway of the fleet from starting."""

from __future__ import annotations

import json
import signal

import httpx

from testkit.played_ecs import SERVICE
from testkit.sluice import start_sluice
from tests.fleet.fleet import ADMIN_KEY, AWS_ENV, WAIT_S, ecs_endpoint_toml, until

ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def endpoint_toml(name: str, service: str, moto_url: str, throttle_file) -> str:
    return ecs_endpoint_toml(name, service, moto_url, provisioner=f'test_throttle_file = "{throttle_file}"\n')


def events(lines: list[str], event: str) -> list[dict]:
    found = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            found.append(record)
    return found


def endpoint(gateway, name: str) -> dict:
    answer = httpx.get(f"{gateway.url}/admin/endpoints/{name}", headers=ADMIN, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_gateway_serves_while_ecs_throttles_and_a_missing_service_fails_only_its_endpoint(moto_ecs, tmp_path):
    url, _ = moto_ecs
    throttle = tmp_path / "throttle"
    throttle.touch()  # every ECS call is refused from the gateway's first moment
    config = (endpoint_toml("org/present", SERVICE, url, throttle)
              + endpoint_toml("org/deleted", "deleted-service", url, throttle))
    env = {**AWS_ENV, "SLUICE_ADMIN_KEY": ADMIN_KEY}
    gateway = start_sluice(tmp_path / "gateway", config=config, env=env, wait=False)
    try:
        def alive() -> bool:
            assert gateway.process.poll() is None, gateway.output[-3000:]
            try:
                return httpx.get(f"{gateway.url}/livez", timeout=30).status_code == 200
            except httpx.HTTPError:
                return False

        until(alive, WAIT_S, "the gateway's /livez")
        until(lambda: len(events(gateway.lines, "ecs_throttled")) >= 2, WAIT_S, "the owner backing off")
        assert alive() and endpoint(gateway, "org/present")["state"] == "scaled_to_zero"
        assert not events(gateway.lines, "ecs_service_adopted")  # nothing adopted while every call is refused
        throttle.unlink()
        until(lambda: endpoint(gateway, "org/deleted")["state"] == "failed", WAIT_S, "the missing service's failure")
        failed = endpoint(gateway, "org/deleted")
        assert failed["reason"] == "service unavailable" and "'deleted-service' not found" in failed["detail"]
        until(lambda: events(gateway.lines, "ecs_service_adopted"), WAIT_S, "the present service's adoption")
        assert [e["service"] for e in events(gateway.lines, "ecs_service_adopted")] == [SERVICE]
        assert endpoint(gateway, "org/present")["state"] == "scaled_to_zero" and alive()
        # a tenant of the failed endpoint is told the fixed reason at once, never the operator's detail
        answer = httpx.post(f"{gateway.url}/v1/completions", headers=ADMIN, timeout=30,
                            json={"model": "org/deleted", "prompt": "hi", "max_tokens": 1})
        assert answer.status_code == 503 and "service unavailable" in answer.text and "not found" not in answer.text
    finally:
        code = gateway.stop(signal.SIGTERM, timeout=WAIT_S)
    assert code == 0, gateway.output[-3000:]
