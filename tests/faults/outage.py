"""Streaming load through an outage of a server the gateway depends on: clients stream without pause while the
server is taken down, stays away, and is brought back; each outcome is tagged with the phase it started in."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tests.faults.load import Outcome, stream_completion

PHASES = ("before", "during", "after")
RECOVERY_BOUND_S = 120  # bounds a server that never recovers: the test then fails on the "after" phase


@dataclass
class Run:
    outcomes: list[tuple[str, Outcome]]
    recovery_s: float  # from the restart until the first request started after it was served

    def by_phase(self) -> dict[str, Counter]:
        return {p: Counter(o.status for q, o in self.outcomes if q == p) for p in PHASES}


async def through_outage(host: str, port: int, key: str, *, clients: int, take_down: Callable[[], None],
                         away: Callable[[], Awaitable[None]], bring_back: Callable[[], None]) -> Run:
    """`take_down` and `bring_back` block (they run in threads); `away` is what happens meanwhile."""
    phase = "before"
    outcomes: list[tuple[str, Outcome]] = []
    served_again: list[float] = []
    stop = asyncio.Event()

    async def client() -> None:
        while not stop.is_set():
            started_in = phase
            outcome = await stream_completion(host, port, key, max_tokens=32)
            outcomes.append((started_in, outcome))
            if started_in == "after" and outcome.status == 200:
                served_again.append(time.monotonic())
            if outcome.status != 200:
                await asyncio.sleep(0.05)

    async def conduct() -> float:
        nonlocal phase
        await asyncio.sleep(1.5)
        await asyncio.to_thread(take_down)
        phase = "during"
        await away()
        phase = "restarting"
        await asyncio.to_thread(bring_back)
        phase = "after"
        restarted = time.monotonic()
        await asyncio.sleep(2.0)
        # and until a request started since is served: on a loaded machine the two seconds may end first
        deadline = restarted + RECOVERY_BOUND_S
        while not served_again and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        return restarted

    restarted, *_ = await asyncio.gather(conduct(), *(client() for _ in range(clients)))
    return Run(outcomes, min(served_again, default=float("inf")) - restarted)
