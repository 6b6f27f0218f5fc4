"""A background task that runs one async step now and then every `interval_s` until stopped: the gateway's
sweeps (dead gateways' ledger logs, expired stored responses) share it. A step handles its own errors; one that
escapes ends the task, as a bug should be seen."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


class Periodic:
    def __init__(self, name: str, interval_s: float, step: Callable[[], Awaitable[object]]) -> None:
        self.name, self.interval_s, self.step = name, interval_s, step
        self._task: asyncio.Task[None] | None = None

    def start(self) -> Periodic:
        self._task = asyncio.create_task(self._run(), name=self.name)
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            await self.step()
            await asyncio.sleep(self.interval_s)
