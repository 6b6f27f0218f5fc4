"""redis-server killed (SIGKILL) and restarted under streaming load: the configured policy holds (fail closed:
new requests get 503 `limiter_unavailable`; fail open and the default `local` policy: they are served), streams
already admitted finish, nothing else fails, `/health` says the limiter is degraded, the log stays small, and once
Redis is back the limits are exact again."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from testkit.admin import default_team_key
from testkit.protocol_worker import worker_process
from testkit.servers import restarted_at_exit
from testkit.stub_gateway import fire_completions, host_port, sluice_on_worker_process
from tests.faults.outage import through_outage

pytestmark = pytest.mark.slow
CLIENTS = 16


def kill(redis):
    def down() -> None:
        redis.process.kill()  # SIGKILL: no goodbye to the gateway's connections
        redis.process.wait()
    return down


POLICIES = {"fail-closed": "limiter_on_outage = \"closed\"", "fail-open": "limiter_fail_open = true",
            "local-default": ""}  # the default: each gateway a share of the limits (issue #50: it was fail-closed)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_redis_killed_and_restarted_under_load(tmp_path, redis, policy):
    extra = f'redis_url = "{redis.url}"\n{POLICIES[policy]}'
    fail_open = policy != "fail-closed"  # served through the outage
    with restarted_at_exit(redis), worker_process(token_delay=0.01) as stub, \
            sluice_on_worker_process(tmp_path / "gw", stub, extra) as server:
        host, port = host_port(server)
        key = default_team_key(server, "load", rpm=1_000_000, tpm=1_000_000_000, max_concurrency=1000)
        probes: list[httpx.Response] = []

        async def away() -> None:
            await asyncio.sleep(2.0)
            async with httpx.AsyncClient() as client:
                probes.append(await client.get(f"{server.url}/health", timeout=30))

        run = asyncio.run(through_outage(host, port, key, clients=CLIENTS, take_down=kill(redis),
                                         away=away, bring_back=redis.start))
        exact = fire_completions(server, default_team_key(server, "exact", rpm=5), 8)
        health = server.log_events("limiter_backend_down"), server.log_events("limiter_backend_up")
        log_bytes = sum(len(line) for line in server.lines)
    outcomes, by_phase = run.outcomes, run.by_phase()
    print(f"\nredis outage ({policy}): statuses by phase {by_phase}; "
          f"served again {run.recovery_s:.2f} s after the restart; gateway log {log_bytes} bytes")
    (probe,) = probes
    assert probe.json()["limiter"] == {"fail-closed": "closed", "fail-open": "open", "local-default": "local"}[policy]
    assert probe.status_code == (503 if policy == "fail-closed" else 200)
    unexpected = [(p, o) for p, o in outcomes if o.status not in (200, 503)
                  or (o.status == 200 and not o.done) or o.error]
    assert unexpected == []
    refused = [o for _, o in outcomes if o.status == 503]
    if fail_open:
        assert refused == []
    else:
        assert refused and all(b"limiter_unavailable" in o.body for o in refused)
        assert by_phase["during"][503] > 0
    assert by_phase["before"][200] > 0  # (a stream started just before the kill may be admitted after it)
    assert by_phase["during"][200] + by_phase["during"][503] == by_phase["during"].total()
    assert by_phase["after"][200] > 0
    assert exact == [200] * 5 + [429] * 3  # the limit holds exactly once Redis is back
    down, up = health
    assert len(down) == 1 and len(up) == 1  # the transition is logged once each way
