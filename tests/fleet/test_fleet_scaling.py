"""A fleet of three gateways over one ECS worker service: one scaling decision, fed by every gateway.

Each test starts from the service at zero tasks with all three gateways up (`Fleet.settle`) and bounds every
wait (a hang fails); none asserts how fast anything went (how soon a dead owner's lease is taken over is
measured by bench/fleet_start.py, not here).
"""

from __future__ import annotations

import json
import signal

import httpx
import pytest

from testkit.played_ecs import CLUSTER
from tests.fleet.fleet import Fleet, until

pytestmark = pytest.mark.slow
LOAD = 4  # streams kept open: demand 4 at target_concurrency 3 wants 2 tasks (and so does 5 or 6)


def current_owner(fleet: Fleet) -> int:
    until(lambda: fleet.owner() is not None, what="an owner")
    return fleet.owner()


def two_tasks_serving(fleet: Fleet) -> bool:
    return fleet.desired() == 2 and len(fleet.played.workers) == 2


def stopped_by_us(fleet: Fleet, arns: list[str]) -> list[str]:
    """The stop reasons of these tasks (every one drained and stopped by a gateway, none by ECS's own pick)."""
    tasks = fleet.played.ecs.describe_tasks(cluster=CLUSTER, tasks=arns)["tasks"]
    return [task.get("stoppedReason", "") for task in tasks]


def scaling_log(fleet: Fleet) -> list[str]:
    """What each gateway did to the service (for a failure's message)."""
    return [f"{index}: {line}" for index, gateway in enumerate(fleet.gateways) if gateway is not None
            for line in gateway.lines if any(word in line for word in ("scale", "desired", "ownership", "drain"))]


def quiet_tail(lines: list[str], count: int = 40) -> str:
    """A gateway's last lines without the request log (for a failure's message)."""
    return "\n".join([line for line in lines if '"path":' not in line][-count:])


def log_events(fleet: Fleet, index: int, event: str, since: int = 0) -> list[dict]:
    found = []
    for line in fleet.gateways[index].lines[since:]:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == event:
            found.append(record)
    return found


def test_traffic_through_one_gateway_scales_the_service_and_no_busy_task_is_stopped(fleet):
    fleet.settle()
    entry = next(i for i in range(3) if i != current_owner(fleet))  # the owner sees this demand through Redis
    first_task = len(fleet.played.started)
    with fleet.streams(lambda: [entry], LOAD) as load:
        until(lambda: two_tasks_serving(fleet), what="two tasks under load")
        served = load.served
        until(lambda: load.served >= served + 2 * LOAD, what="streams on both tasks")
    assert not load.cut, load.cut[:3]
    until(lambda: fleet.desired() == 0 and not fleet.played.workers, what="the scale to zero once idle")
    tasks = fleet.played.started[first_task:]
    assert len(tasks) == 2, (fleet.played.desired_seen, scaling_log(fleet))  # up to 2 under load, never more
    assert all(fleet.played.stopped_busy[arn] == 0 for arn in tasks), fleet.played.stopped_busy
    assert all("sluice" in reason for reason in stopped_by_us(fleet, tasks))


def test_ecs_throttling_backs_off_and_nothing_crashes(fleet):
    fleet.settle()
    owner = current_owner(fleet)
    marks = [len(g.lines) for g in fleet.gateways]
    fleet.throttle_file.touch()
    try:
        with fleet.streams(lambda: [0, 1, 2], 2) as load:  # demand at zero tasks: the owner must call ECS
            until(lambda: len(log_events(fleet, owner, "ecs_throttled", marks[owner])) >= 4,
                  what="the owner backing off")
            for gateway in fleet.gateways:  # every gateway is up and answering while ECS refuses
                assert gateway.process.poll() is None
                assert httpx.get(f"{gateway.url}/health", timeout=10).status_code == 200
            fleet.throttle_file.unlink()
            until(lambda: load.served >= 2, what="streams once ECS answers again")
    finally:
        fleet.throttle_file.unlink(missing_ok=True)
    assert not load.cut, load.cut[:3]
    bases = [event["base_s"] for event in log_events(fleet, owner, "ecs_throttled", marks[owner])]
    assert bases[:4] == [0.5, 1.0, 2.0, 4.0]  # exponential backoff, not a call per tick
    for index in range(3):
        assert not log_events(fleet, index, "endpoint_tick_failed", marks[index])


def test_a_rolling_restart_under_streaming_load_cuts_no_stream_and_lowers_no_count(fleet):
    fleet.settle()
    up = [0, 1, 2]
    with fleet.streams(lambda: list(up), LOAD) as load:
        until(lambda: two_tasks_serving(fleet), what="two tasks under load")
        for index in range(3):
            up.remove(index)
            stopping = fleet.gateways[index]
            code = fleet.stop(index)
            assert code == 0, quiet_tail(stopping.lines)  # drained its own streams, exited cleanly
            assert not [line for line in stopping.lines if "drain_timed_out" in line], quiet_tail(stopping.lines)
            draining = next(n for n, line in enumerate(stopping.lines) if '"gateway_draining"' in line)
            writes = [line for line in stopping.lines[draining:] if '"ecs_desired_count"' in line]
            assert not writes, writes  # a stopping gateway leaves the service as it is
            assert fleet.desired() > 0
            fleet.start(index)
            up.append(index)
        served = load.served
        until(lambda: load.served >= served + LOAD, what="streams after the restart")
    assert not load.cut, load.cut[:3]
    assert not any(fleet.played.stopped_busy.values()), fleet.played.stopped_busy


def test_a_killed_owner_is_replaced_without_scaling_twice(fleet):
    fleet.settle()
    owner = current_owner(fleet)
    others = [i for i in range(3) if i != owner]
    with fleet.streams(lambda: others, LOAD) as load:
        until(lambda: two_tasks_serving(fleet), what="two tasks under load")
        started, mark = len(fleet.played.started), len(fleet.played.desired_seen)
        fleet.stop(owner, signal.SIGKILL)
        until(lambda: fleet.owner() not in (None, owner), what="another gateway taking the lease")
        served = load.served
        until(lambda: load.served >= served + 2 * LOAD, what="streams under the new owner")
        after = fleet.played.desired_seen[mark:]
    assert not load.cut, load.cut[:3]
    assert len(fleet.played.started) == started and max(after, default=2) == 2, after  # no second scale-up
    assert not any(fleet.played.stopped_busy.values()), fleet.played.stopped_busy
