"""Tenants' turns at the threads that prepare requests (worker/tenant_turns.py): a tenant holds at most its share of
them, a freed thread goes to the tenant whose last turn is the oldest, and a caller that leaves gives its turn
back once its call has ended. Calls block on events the test sets: an order, never a time."""

from __future__ import annotations

import asyncio
import threading

from worker.tenant_turns import TenantTurns


def blocking(started: list[str], release: threading.Event, name: str):
    def call() -> str:
        started.append(name)
        release.wait(30)
        return name
    return call


async def settle() -> None:
    for _ in range(50):  # the loop and the pool's threads take their steps
        await asyncio.sleep(0.01)


def test_one_tenant_holds_at_most_its_share_and_another_goes_next():
    async def scenario() -> None:
        turns = TenantTurns(threads=3, per_tenant=2)
        started: list[str] = []
        release = threading.Event()
        hostile = [asyncio.create_task(turns.run("a", blocking(started, release, f"a{i}"))) for i in range(6)]
        await settle()
        assert sorted(started) == ["a0", "a1"]  # two of six, the third thread left free
        quiet = asyncio.create_task(turns.run("b", lambda: "b"))
        assert await asyncio.wait_for(quiet, 30) == "b"  # while every call of "a" still waits or runs
        assert all(not task.done() for task in hostile)
        release.set()
        assert sorted(await asyncio.gather(*hostile)) == [f"a{i}" for i in range(6)]

    asyncio.run(scenario())


def test_a_freed_thread_goes_to_the_tenant_that_waited_longest_for_its_turn():
    async def scenario() -> None:
        turns = TenantTurns(threads=1, per_tenant=1)
        started: list[str] = []
        gates = {name: threading.Event() for name in ("a0", "a1", "a2", "b0")}
        tasks = [asyncio.create_task(turns.run("a", blocking(started, gates[name], name))) for name in ("a0", "a1")]
        await settle()
        tasks.append(asyncio.create_task(turns.run("b", blocking(started, gates["b0"], "b0"))))
        tasks.append(asyncio.create_task(turns.run("a", blocking(started, gates["a2"], "a2"))))
        await settle()
        for name in ("a0", "b0", "a1", "a2"):
            gates[name].set()
            await settle()
        await asyncio.gather(*tasks)
        assert started == ["a0", "b0", "a1", "a2"]  # "b" arrived after "a1" but had not had a turn

    asyncio.run(scenario())


def test_a_caller_that_leaves_frees_its_turn_when_its_call_ends():
    async def scenario() -> None:
        turns = TenantTurns(threads=1, per_tenant=1)
        started: list[str] = []
        release = threading.Event()
        running = asyncio.create_task(turns.run("a", blocking(started, release, "a0")))
        waiting = asyncio.create_task(turns.run("a", blocking(started, release, "a1")))
        await settle()
        running.cancel()
        waiting.cancel()  # left the line before its turn: never runs
        await settle()
        after = asyncio.create_task(turns.run("b", lambda: "b"))
        await settle()
        assert not after.done()  # the thread still works on the call its caller left
        release.set()
        assert await asyncio.wait_for(after, 30) == "b"
        assert started == ["a0"]

    asyncio.run(scenario())
