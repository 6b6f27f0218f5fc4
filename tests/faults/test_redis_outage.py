"""redis-server killed (SIGKILL) and restarted under streaming load: the configured policy holds (fail closed:
new requests get 503 `limiter_unavailable`; fail open: they are served), streams already admitted finish,
nothing else fails, and once Redis is back the limits are exact again."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from tests.faults.conftest import create_key, fire_completions, gateway, host_port, stub_worker
from tests.faults.load import Outcome, stream_completion

pytestmark = pytest.mark.slow
CLIENTS = 16


async def load_through_outage(host: str, port: int, key: str, redis) -> tuple[list[tuple[str, Outcome]], float]:
    """Streams before, during and after the outage, each tagged with the phase it started in; and the seconds
    from the restart until the first request served again."""
    phase = "before"
    outcomes: list[tuple[str, Outcome]] = []
    recovered_at: list[float] = []
    stop = asyncio.Event()

    async def client() -> None:
        while not stop.is_set():
            started_in = phase
            outcome = await stream_completion(host, port, key, max_tokens=32)
            outcomes.append((started_in, outcome))
            if started_in == "after" and outcome.status == 200 and not recovered_at:
                recovered_at.append(time.monotonic())
            if outcome.status != 200:
                await asyncio.sleep(0.05)

    async def conduct() -> None:
        nonlocal phase
        await asyncio.sleep(1.5)
        redis.process.kill()  # SIGKILL: no goodbye to the gateway's connections
        redis.process.wait()
        phase = "during"
        await asyncio.sleep(2.0)
        phase = "restarting"
        await asyncio.to_thread(redis.start)
        phase = "after"
        restarted = time.monotonic()
        await asyncio.sleep(2.0)
        stop.set()
        recovered_at.insert(0, restarted)

    await asyncio.gather(conduct(), *(client() for _ in range(CLIENTS)))
    return outcomes, recovered_at[1] - recovered_at[0] if len(recovered_at) > 1 else float("inf")


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail-closed", "fail-open"])
def test_redis_killed_and_restarted_under_load(tmp_path, redis, fail_open):
    extra = f'redis_url = "{redis.url}"\nlimiter_fail_open = {str(fail_open).lower()}'
    try:
        with stub_worker(token_delay=0.01) as stub, gateway(tmp_path / "gw", stub, extra) as server:
            host, port = host_port(server)
            key = create_key(server, "load", rpm=1_000_000, tpm=1_000_000_000, max_concurrency=1000)
            outcomes, recovery = asyncio.run(load_through_outage(host, port, key, redis))
            exact = fire_completions(server, create_key(server, "exact", rpm=5), 8)
            health = server.log_events("limiter_backend_down"), server.log_events("limiter_backend_up")
    finally:
        if redis.process.poll() is not None:
            redis.start()
    by_phase = {p: Counter(o.status for q, o in outcomes if q == p) for p in ("before", "during", "after")}
    print(f"\nredis outage ({'fail open' if fail_open else 'fail closed'}): statuses by phase {by_phase}; "
          f"served again {recovery:.2f} s after the restart")
    unexpected = [(p, o) for p, o in outcomes if o.status not in (200, 503)
                  or (o.status == 200 and not o.done) or o.error]
    assert unexpected == []
    refused = [o for _, o in outcomes if o.status == 503]
    if fail_open:
        assert refused == []
    else:
        assert refused and all(b"limiter_unavailable" in o.body for o in refused)
        assert by_phase["during"][503] > 0
    assert by_phase["before"] == {200: by_phase["before"].total()}
    assert by_phase["during"][200] + by_phase["during"][503] == by_phase["during"].total()
    assert by_phase["after"][200] > 0
    assert exact == [200] * 5 + [429] * 3  # the limit holds exactly once Redis is back
    down, up = health
    assert len(down) == 1 and len(up) == 1  # the transition is logged once each way
