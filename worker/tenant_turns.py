"""Tenants take turns at the threads that do a request's work before the engine: preparing a generation
(the chat template, tokenizing, a grammar) and the tokenizer routes (`/tokenize`, `/detokenize`).

That work runs off the event loop and off the engine's thread, on at most `threads` threads at once, which the OS
schedules after the engine's (niceness PREPARE_NICENESS: a long prompt tokenizing slows no decode step much).
One tenant (`GenerateRequest.tenant`, the billed team's tag) holds at most `per_tenant` of them at a time (a
quarter of the cores, at least one); its other calls wait in its own line. A freed thread goes to the waiting
tenant whose last turn is the oldest, so a tenant with one short call waits for at most one call of each other
tenant to end, however many calls they have queued. Before, generations shared the event loop's default executor
first come, first served (6 threads on 2 cores: six long prompts held every one of them), and tokenizer calls
one global semaphore.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import os
import threading
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
PREPARE_NICENESS = 5  # below the engine, above start-up work (worker.threads.BACKGROUND_NICENESS)


def default_threads() -> int:
    return min(32, (os.cpu_count() or 1) + 4)  # as asyncio's default executor: short calls beside long ones


def default_per_tenant() -> int:
    return max(1, (os.cpu_count() or 1) // 4)  # a tokenizer releases the GIL: one call can take a whole core


def _lower_priority() -> None:
    with contextlib.suppress(OSError):  # Linux niceness is per thread
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PREPARE_NICENESS)


class TenantTurns:
    def __init__(self, threads: int | None = None, per_tenant: int | None = None):
        self.threads = threads or default_threads()
        self.per_tenant = per_tenant or default_per_tenant()
        self._free = self.threads
        self._running: Counter[str] = Counter()
        self._waiting: dict[str, deque[asyncio.Future]] = {}
        self._clock = itertools.count(1)
        self._last_turn: dict[str, int] = {}  # tenants with calls waiting or running -> when their last turn began

    async def run(self, tenant: str, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` on one of the threads, in `tenant`'s turn. The turn is held until the call ends,
        also when the caller stops waiting for it (a thread still works on it)."""
        await self._turn(tenant)
        loop = asyncio.get_running_loop()
        try:
            done = _in_thread(functools.partial(function, *args))
        except BaseException:
            self._release(tenant)
            raise
        done.add_done_callback(lambda _: loop.call_soon_threadsafe(self._release, tenant))
        return await asyncio.wrap_future(done)

    async def _turn(self, tenant: str) -> None:
        granted = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(tenant, deque()).append(granted)
        self._last_turn.setdefault(tenant, 0)
        self._grant()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # its turn came as it left: hand it on
                self._release(tenant)
            else:
                self._forget(tenant, granted)
            raise

    def _grant(self) -> None:
        while self._free > 0:
            ready = [t for t, line in self._waiting.items() if line and self._running[t] < self.per_tenant]
            if not ready:
                return
            tenant = min(ready, key=lambda t: self._last_turn[t])
            granted = self._waiting[tenant].popleft()
            if not self._waiting[tenant]:
                del self._waiting[tenant]
            if granted.done():  # cancelled meanwhile (its waiter is being torn down)
                continue
            self._free -= 1
            self._running[tenant] += 1
            self._last_turn[tenant] = next(self._clock)
            granted.set_result(None)

    def _release(self, tenant: str) -> None:
        self._free += 1
        self._running[tenant] -= 1
        if self._running[tenant] <= 0:
            del self._running[tenant]
            if tenant not in self._waiting:
                self._last_turn.pop(tenant, None)  # nothing of it left: its memory goes with it
        self._grant()

    def _forget(self, tenant: str, granted: asyncio.Future) -> None:
        line = self._waiting.get(tenant)
        if line is not None and granted in line:
            line.remove(granted)
            if not line:
                del self._waiting[tenant]
        if tenant not in self._waiting and tenant not in self._running:
            self._last_turn.pop(tenant, None)



def _in_thread(call: Callable[[], T]) -> Future:
    """`call` on a new daemon thread (the turns bound how many run; starting one costs some 0.1 ms): a call that
    never ends, a grammar compile stuck, say, must not keep the process from exiting."""
    done: Future = Future()

    def work() -> None:
        _lower_priority()
        if done.set_running_or_notify_cancel():
            try:
                done.set_result(call())
            except BaseException as error:  # handed to the caller, who raises it
                done.set_exception(error)

    threading.Thread(target=work, name="sluice-prepare", daemon=True).start()
    return done
