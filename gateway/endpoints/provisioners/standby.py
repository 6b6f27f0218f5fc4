"""A spare local worker process kept imported and waiting, so that a model waking from zero skips the
imports (torch, transformers, the engine: several seconds of a cold start on a small host).

One spare serves every local endpoint; it holds no model and takes no CPU while it waits (a few
hundred MB of memory). Its own start takes seconds of a core (the imports), so
a spare is only spawned while the local workers are quiet (`quiet`: none starting, no request on one or
waiting for one), and at the earliest `refill_delay_s` after an endpoint took the last one: a burst that
woke an endpoint is served at the speed of a warm one, not beside a refill's imports. It is only kept
while some local endpoint can scale (min_replicas < max_replicas, or 0).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from common.worker_launch import STANDBY_READY
from gateway.endpoints.provisioners.worker_process import WorkerProcess
from gateway.lifecycle import Background

QUIET_POLL_S = 0.5  # how often a refill that waits looks again
REFILL_STOP_S = 10.0  # a close cancels the refill: what a spawn under way gets to unwind


class StandbyWorkers:
    def __init__(self, refill_delay_s: float = 10.0, quiet: Callable[[], bool] = lambda: True):
        self.refill_delay_s = refill_delay_s
        self.quiet = quiet  # the Endpoints service sets it: whether the local workers are quiet now
        self.wanted = False
        self._spare: WorkerProcess | None = None
        self._refill = Background("standby refill")  # at most one task: the next spare, after a delay

    def want(self) -> None:
        """Some endpoint can scale: keep a spare from now on."""
        if not self.wanted:
            self.wanted = True
            self._schedule(0.0)

    @property
    def ready(self) -> bool:
        """A spare has imported everything and waits (its last line says so)."""
        spare = self._spare
        return spare is not None and spare.returncode is None and STANDBY_READY in spare.last_line

    def take(self) -> WorkerProcess | None:
        """The spare (still importing, perhaps: it is ahead all the same), or None."""
        spare, self._spare = self._spare, None
        if self.wanted:
            self._schedule(self.refill_delay_s)
        if spare is None or spare.returncode is not None:
            return None
        return spare

    async def close(self) -> None:
        self.wanted = False
        await self._refill.stop(REFILL_STOP_S)
        spare, self._spare = self._spare, None
        if spare is not None:
            await spare.stop()

    def _schedule(self, delay: float) -> None:
        if not self._refill:
            self._refill.spawn(self._spawn_after(delay), name="standby refill")

    async def _spawn_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        while not self.quiet():
            await asyncio.sleep(QUIET_POLL_S)
        if self._spare is None or self._spare.returncode is not None:
            self._spare = await WorkerProcess.spawn_standby()
