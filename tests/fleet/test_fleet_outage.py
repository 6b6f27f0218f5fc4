"""`sluice serve` with ten ECS endpoints (moto) whose Redis is SIGKILLed, stays away, and comes back empty.

Issue #50 measured this case: every generation got 503 `limiter_unavailable`, the log grew 1.68 MB in 10 s (a
traceback per tick per endpoint), and nothing said when the fleet could scale again. Now the default limiter policy
admits on a local share, the loops log each failure once (repeated_failure.py), no service is written while no
lease can be vouched for, and once Redis answers the endpoint's owner takes a fresh lease and scales again."""

from __future__ import annotations

import contextlib
import json
import signal
import time

import httpx
import redis as redis_client

from testkit.played_ecs import CLUSTER, SERVICE, desired_count
from testkit.servers import restarted_at_exit
from testkit.sluice import start_sluice
from tests.fleet.fleet import ADMIN_KEY, AWS_ENV, WAIT_S, ecs_endpoint_toml, until

ENDPOINTS = 16  # adopting them takes 8 s at the default 2 ECS calls/s: Redis goes while most are not adopted
AWAY_S = 10.0  # the window: 10 endpoints logged 1.68 MB in it
LOG_BOUND = ENDPOINTS * 8 * 1024  # each failing source logs once with its traceback (~3 KB), not once per tick
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def events(lines: list[str]) -> list[str]:
    found = []
    for line in lines:
        with contextlib.suppress(ValueError, AttributeError):
            found.append(json.loads(line).get("event"))
    return found


def completion(gateway, wait_s: int) -> httpx.Response:
    """One request to org/m0 (asleep; moto's tasks never serve), waiting at most `wait_s` for a replica."""
    return httpx.post(f"{gateway.url}/v1/completions", timeout=WAIT_S,
                      headers={**ADMIN, "x-scale-up-timeout": str(wait_s)},
                      json={"model": "org/m0", "prompt": "hi", "max_tokens": 1})


def test_redis_away_logs_little_scales_nothing_and_scaling_resumes_when_it_is_back(moto_ecs, redis, tmp_path):
    url, ecs = moto_ecs
    network = ecs.describe_services(cluster=CLUSTER, services=[SERVICE])["services"][0]["networkConfiguration"]
    services = [SERVICE] + [f"svc-{n}" for n in range(1, ENDPOINTS)]
    for service in services[1:]:
        ecs.create_service(cluster=CLUSTER, serviceName=service, taskDefinition=SERVICE, desiredCount=0,
                           launchType="FARGATE", networkConfiguration=network)
    # the session's Redis may hold a lease on SERVICE from an earlier module's gateway, SIGKILLed at its end: this
    # gateway would wait for that owner's liveness to lapse (10 s) while every other service is adopted
    with contextlib.closing(redis_client.Redis.from_url(redis.url)) as shared:
        shared.flushdb()
    config = f'redis_url = "{redis.url}"\n\n' + "".join(
        ecs_endpoint_toml(f"org/m{n}", s, url, model="max_wait_seconds = 60\n") for n, s in enumerate(services))
    gateway = start_sluice(tmp_path / "gateway", config=config, env={**AWS_ENV, "SLUICE_ADMIN_KEY": ADMIN_KEY},
                           wait=False)
    with restarted_at_exit(redis):
        try:
            gateway.wait_alive(timeout=WAIT_S)
            until(lambda: len(gateway.log_events("endpoint_ownership")) >= ENDPOINTS, WAIT_S, "every lease taken")
            redis.process.kill()  # SIGKILL: no goodbye to the gateway's connections
            redis.process.wait()
            adopted = len(gateway.log_events("ecs_service_adopted"))
            before = len(gateway.lines)
            away = completion(gateway, 2)  # admitted by the local share, then no replica: never limiter_unavailable
            time.sleep(AWAY_S)
            health = httpx.get(f"{gateway.url}/health", headers=ADMIN, timeout=WAIT_S)
            during = gateway.lines[before:]
            assert desired_count(ecs) == 0  # no lease could be vouched for: nothing wrote the service
            # a budget slot Redis cannot count is a backoff, not the service's failure: no endpoint failed
            states = {e["id"]: e["state"] for e in httpx.get(f"{gateway.url}/v1/endpoints", headers=ADMIN,
                                                              timeout=WAIT_S).json()["data"]}
            redis.start()  # empty: no lease, no config version, no limiter counts
            # the owner takes a fresh lease; a request's demand scales the service again
            until(lambda: completion(gateway, 1).status_code == 503 and desired_count(ecs) == 1, WAIT_S,
                  "a scale-up after Redis")
            assert gateway.log_events("limiter_backend_up")  # and the limits are Redis's again
            # the services not adopted before the outage are adopted after it, none failed
            until(lambda: {e["service"] for e in gateway.log_events("ecs_service_adopted")} == set(services), WAIT_S,
                  "every adoption")
            assert gateway.process.poll() is None
        finally:
            code = gateway.stop(signal.SIGTERM, timeout=WAIT_S)
    (tmp_path / "during.log").write_text("\n".join(during))  # a failure's post-mortem
    assert adopted < ENDPOINTS  # the case in question: owners adopting while Redis went away
    assert "failed" not in states.values() and not [e for e in events(during) if e == "endpoint_failed"], states
    assert away.status_code == 503, away.text
    assert away.json()["error"]["code"] == "scale_up_timeout", away.text
    assert health.json()["limiter"] == "local", health.text
    logged = sum(len(line) + 1 for line in during)
    print(f"\nlog while Redis was away ({ENDPOINTS} ECS endpoints, {AWAY_S:.0f} s): {logged} bytes, "
          f"{len(during)} lines, {sum('Traceback' in line for line in during)} with a traceback")
    assert logged < LOG_BOUND, "\n".join(during)[-6000:]
    assert code == 0, gateway.output[-3000:]
