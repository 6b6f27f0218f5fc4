"""The shared state of a fleet (gateway/endpoints/fleet.py) against a real redis-server: one lease holder at a
time with a growing fencing token, reports that expire, and an ECS API budget no number of gateways exceeds."""

from __future__ import annotations

import asyncio
import math
import time
import uuid

import asyncpg
import pytest

from gateway.config import load_settings
from gateway.endpoints import fleet as fleet_module
from gateway.endpoints.fleet import FAILURE_DETAIL_CHARS, Failure, Fleet, LocalFleet, RedisFleet, Replicas, Report
from gateway.endpoints.fleet_postgres import PostgresFleet
from testkit.databases import create_database

LEASE_S = 0.5


@pytest.fixture(params=["redis", "postgres"])
async def shared_state(request):
    """A factory of `count` gateways' views of one fresh shared state (Redis, or a new PostgreSQL database)."""
    opened: list[Fleet] = []
    if request.param == "redis":
        url, prefix = request.getfixturevalue("redis").url, f"test-fleet:{uuid.uuid4().hex[:8]}"

        async def open_one(name: str, calls: float) -> Fleet:
            return RedisFleet(url, prefix=prefix, gateway_id=name, calls_per_second=calls)
    else:
        url = await create_database(request.getfixturevalue("postgres").url, "fleet")

        async def open_one(name: str, calls: float) -> Fleet:
            return await PostgresFleet.open(url, gateway_id=name, calls_per_second=calls)

    async def gateways(count: int, calls: float = 2.0) -> list[Fleet]:
        made = [await open_one(f"gateway-{n}", calls) for n in range(count)]
        opened.extend(made)
        return made

    yield gateways
    for fleet in opened:
        await fleet.close()


async def test_one_gateway_holds_the_lease_and_a_successor_fences_it_out(shared_state):
    first, second = await shared_state(2)
    token, reports, holder = await first.sync("model", Report(2.0), LEASE_S, LEASE_S)
    assert token is not None and set(reports) == {"gateway-0"} and holder == "gateway-0"
    follower, reports, holder = await second.sync("model", Report(3.0), 10, LEASE_S)
    assert follower is None and holder == "gateway-0"
    assert {name: r.demand for name, r in reports.items()} == {"gateway-0": 2.0, "gateway-1": 3.0}
    assert await first.fence("model", token) and not await second.fence("model", 1)
    await asyncio.sleep(LEASE_S * 2)  # the first gateway stops renewing (dead, or its loop stalled)
    await second.watch(10)  # the second's periodic look at the fleet
    successor, reports, _ = await second.sync("model", Report(3.0), 10, LEASE_S)
    assert successor is not None and successor > token
    assert set(reports) == {"gateway-1"}  # the silent gateway's report expired with it
    assert await second.fence("model", successor)
    assert not await first.fence("model", token)  # the old owner wakes up: it may not write any more
    again, _, holder = await first.sync("model", Report(0.0), LEASE_S, LEASE_S)
    assert holder == "gateway-1"
    assert again is None


async def test_one_renewal_keeps_every_lease_still_held_with_its_token_and_no_other(shared_state, monkeypatch):
    """An idle owner's leases are renewed together (lease_renewal.py), each fenced as a sync renews it: a lease
    that lapsed and was taken, or held under another token, is not renewed and its new holder keeps writing."""
    monkeypatch.setattr(fleet_module, "RENEW_KEYS", 3)  # Redis: four leases go in two scripts
    first, second = await shared_state(2)
    tokens = {name: (await first.sync(name, Report(0.0), 10, LEASE_S)).token for name in ("a", "b", "c", "d")}
    assert all(tokens.values())
    assert await first.renew({}, LEASE_S) == set()
    for _ in range(4):  # renewed for twice the lease, with no sync: none lapses
        assert await first.renew(tokens, LEASE_S) == set(tokens)
        await asyncio.sleep(LEASE_S / 2)
    assert (await second.sync("a", Report(0.0), 10, LEASE_S)).holder == "gateway-0"
    await asyncio.sleep(LEASE_S * 1.5)  # nothing renews: every lease lapses and the second gateway takes "b"
    taken = (await second.sync("b", Report(0.0), 10, 30)).token
    assert taken is not None and taken > tokens["b"]
    stale = {**tokens, "c": tokens["c"] + 7}  # "c" under a token it never had
    assert await first.renew(stale, LEASE_S) == set()  # lapsed ("a", "d"), taken ("b"), not ours ("c")
    assert await second.fence("b", taken) and not await first.fence("b", tokens["b"])
    again = (await first.sync("a", Report(0.0), 10, LEASE_S)).token  # a sync takes the lapsed one back...
    assert again is not None and again > tokens["a"]
    assert await first.renew({"a": again, "b": tokens["b"]}, LEASE_S) == {"a"}  # ...and a renewal keeps it
    assert await first.fence("a", again)


async def test_postgres_syncs_of_one_endpoint_never_hold_up_another_endpoints(postgres):
    """Before issue #50 every PostgreSQL sync took one fleet-wide advisory lock: an endpoint whose lease row was held
    (a slow sync, a fence's transaction) stopped every other endpoint's sync. Now a sync waits for its own row only."""
    url = await create_database(postgres.url, "fleet")
    fleets = [await PostgresFleet.open(url, gateway_id=f"gateway-{n}") for n in range(2)]
    holder = await asyncpg.connect(url)
    try:
        await fleets[0].sync("held", Report(0.0), 10, 30)
        blocker = holder.transaction()
        await blocker.start()
        await holder.execute("SELECT * FROM fleet_leases WHERE endpoint = 'held' FOR UPDATE")  # a fence's lock
        waiting = asyncio.ensure_future(fleets[1].sync("held", Report(1.0), 10, 30))
        await asyncio.sleep(0.5)
        assert not waiting.done()  # the held endpoint's own sync waits for its row...
        other = await asyncio.wait_for(fleets[1].sync("other", Report(1.0), 10, 30), 30)  # ...no other does
        assert other.token is not None
        await blocker.rollback()
        assert (await asyncio.wait_for(waiting, 30)).holder == "gateway-0"
    finally:
        await holder.close()
        for fleet in fleets:
            await fleet.close()


async def test_a_resigning_owner_hands_the_lease_over_at_once(shared_state):
    first, second = await shared_state(2)
    token, _, _ = await first.sync("model", Report(1.0), 10, 30)
    assert (await second.sync("model", Report(1.0), 10, 30))[0] is None
    await first.resign("model")  # a stopping gateway
    successor, reports, _ = await second.sync("model", Report(1.0), 10, 30)
    assert successor is not None and successor > token and set(reports) == {"gateway-1"}


async def test_twelve_gateways_make_at_most_two_ecs_calls_a_second(shared_state):
    fleet = await shared_state(12)
    granted = []

    async def poll_as_hard_as_possible(gateway: Fleet, until: float) -> None:
        while time.time() < until:
            if await gateway.take_call("ecs:us-east-1", 1) == 0:
                granted.append(time.time())
            else:
                await asyncio.sleep(0.01)

    start = time.time()
    end = math.floor(start) + 3.5  # three whole seconds and two part ones
    await asyncio.gather(*(poll_as_hard_as_possible(gateway, end) for gateway in fleet))
    windows = math.floor(end) - math.floor(start) + 1
    assert 0 < len(granted) <= 2 * windows
    assert await fleet[0].take_call("ecs:us-east-1", 3) > 0  # more than a second's budget never goes


async def test_a_failure_is_the_whole_fleets_bounded_and_cleared_by_any_gateway(shared_state):
    first, second = await shared_state(2)
    await first.mark_failed("model", Failure("crash loop", "crash loop: " + "x" * 100_000))
    seen = await second.failure("model")
    assert seen.reason == "crash loop" and len(seen.detail) == FAILURE_DETAIL_CHARS  # bounded where it is stored
    assert await second.failure("other") is None  # one endpoint's failure only
    await second.clear_failed("model")
    assert await first.failure("model") is None


async def test_a_config_bump_is_counted_and_wakes_the_other_gateways(shared_state):
    first, second = await shared_state(2)
    assert await second.config_version() == 0
    assert (await second.changes(0.05)).relisten  # (re)connects its listener: at once, look at every version
    waiting = asyncio.ensure_future(second.changes(3600))
    await asyncio.sleep(0)
    assert await first.bump_config() == 1
    assert (await asyncio.wait_for(waiting, 60)).config  # the message, not the hour's check, ends the wait
    assert await second.config_version() == 1


async def test_an_owners_changes_and_a_wake_reach_the_others_by_message_and_by_version(shared_state):
    owner, other = await shared_state(2)
    await other.changes(0.05)  # listening
    await owner.watch(10)
    before = (await other.watch(10)).state_version
    await owner.share("model", Replicas(1, [("task-1", "http://10.0.0.1:8100")], 1))
    await owner.mark_draining("model", "task-1")
    await owner.mark_failed("model", Failure("crash loop", "crash loop: x"))
    heard = set()
    while heard != {"model"}:
        heard |= (await asyncio.wait_for(other.changes(60), 60)).endpoints
    seen = await other.watch(10)
    assert seen.state_version == before + 3 and {"gateway-0", "gateway-1"} <= seen.alive
    versions = await other.state_versions()  # what a gateway that missed the messages reads
    assert versions["model"] == seen.state_version and "other" not in versions
    await other.wake("model")
    assert (await asyncio.wait_for(owner.changes(60), 60)).relisten  # the owner's first call: it listens now
    await other.wake("model")
    woken = set()
    while not woken:
        woken |= (await asyncio.wait_for(owner.changes(60), 60)).wake
    assert woken == {"model"}


async def test_a_report_counts_while_its_gateway_is_alive_however_old(shared_state):
    first, second = await shared_state(2)
    await first.sync("model", Report(2.0, {"task-1": 1}), LEASE_S, 30)
    await second.sync("model", Report(0.0), 10, 30)
    for _ in range(3):  # the first gateway says only that it is alive: its report of "model" still counts
        await asyncio.sleep(LEASE_S)
        await first.watch(LEASE_S * 2)
    _, reports, _ = await second.sync("model", Report(0.0), 10, 30)
    assert reports["gateway-0"].in_flight == {"task-1": 1}
    await asyncio.sleep(LEASE_S * 3)  # then it is gone (it stops saying so): its report with it
    await second.watch(10)
    _, reports, _ = await second.sync("model", Report(0.0), 10, 30)
    assert set(reports) == {"gateway-1"}


async def test_the_lone_gateway_owns_every_endpoint_without_redis():
    alone = LocalFleet(calls_per_second=2)
    token, reports, _ = await alone.sync("model", Report(4.0), 1, 1)
    assert token is not None and await alone.fence("model", token) and reports[alone.gateway_id].demand == 4.0
    assert await alone.renew({"model": token}, 1) == {"model"}


@pytest.mark.parametrize(("scaling", "words"), [
    ("lease_seconds = 0.4", ["lease_seconds", "twice", "fleet_sync_seconds"]),
    ("ecs_api_calls_per_second = 1.5", ["ecs_api_calls_per_second", ">= 2"]),
])
def test_fleet_settings_that_cannot_work_are_refused_by_name(tmp_path, scaling, words):
    config = tmp_path / "sluice.toml"
    config.write_text(f"[scaling]\n{scaling}\n")
    with pytest.raises(SystemExit) as failure:
        load_settings(str(config))
    message = str(failure.value)
    assert message.startswith("sluice: ") and all(word in message for word in words), message
