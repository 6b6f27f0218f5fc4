"""The sweep that purges stored responses past their retention (`[responses] retention_s`), every
`sweep_interval_s`, in each gateway (a fleet's sweeps delete the same rows; the second finds none). Reads never
wait for it: an expired response is already gone for `GET` and `previous_response_id`."""

from __future__ import annotations

import asyncio

import structlog

from common.errors import SluiceError
from gateway.dialects.responses.store import ResponseStore

log = structlog.get_logger("gateway")


class ResponseSweeper:
    def __init__(self, store: ResponseStore, interval_s: float) -> None:
        self.store, self.interval_s = store, interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> ResponseSweeper:
        self._task = asyncio.create_task(self._run(), name="responses-sweeper")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        while True:
            try:
                purged = await self.store.purge_expired()
                if purged:
                    log.info("responses.purged", expired=purged)
            except SluiceError as error:  # the database is away: the next round tries again
                log.warning("responses.purge_failed", error=error.message)
            except Exception:  # a bug must not end the sweeps for good
                log.exception("responses.purge_failed")
            await asyncio.sleep(self.interval_s)
