"""Keeps this gateway's endpoints equal to the fleet's: an admin change on any gateway (stored in the shared
database, then `Fleet.bump_config`) reaches every other one.

The follower waits for a bump's message (Redis pub/sub, PostgreSQL LISTEN/NOTIFY) or `check_s`, whichever
comes first, then compares the fleet's config version with the one it last loaded and reloads on a difference.
The version is read before the reload and a change is stored before its bump, so the reload sees at least
what that version stands for; a message lost (a reconnect, a listener down) delays a change by `check_s` at
most, it never loses one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

from gateway.endpoints.fleet import Fleet
from gateway.endpoints.repeated_failure import RepeatedFailure
from gateway.lifecycle import Background

log = structlog.get_logger(__name__)
STOP_S = 5.0  # the longest a stopping gateway waits for a reload in progress


class ConfigFollower:
    def __init__(self, fleet: Fleet, reload: Callable[[], Awaitable[None]], check_s: float):
        self.fleet = fleet
        self.reload = reload
        self.check_s = check_s
        self.version: int | None = None  # the version this gateway's endpoints reflect (None: unknown yet)
        self._task = Background("endpoint config follower")
        self._closing = False  # a cancel alone may be swallowed (controller.py, `_stop_loop`)
        self._failure = RepeatedFailure("endpoint_config_follow_failed")

    async def start(self) -> None:
        """Before the first load: a change stored after this read is reloaded, none is skipped."""
        try:
            self.version = await self.fleet.config_version()
        except Exception as error:  # the shared state is away: the first look that works reloads
            self._failure.failed(error)
        self._task.spawn(self._run(), name="endpoint config follower")

    async def _run(self) -> None:
        while not self._closing:
            try:
                await self.catch_up()
                await self.fleet.config_changed(self.check_s)
                self._failure.succeeded()
            except Exception as error:
                self._failure.failed(error)
                await asyncio.sleep(self.check_s)

    async def catch_up(self, reload: Callable[[], Awaitable[None]] | None = None) -> bool:
        """Reload (with `reload`, default the follower's own) if the fleet's version moved since the last load;
        True when it did. An admin change runs it first, under its lock, so that it changes the fleet's latest."""
        version = await self.fleet.config_version()
        if version == self.version:
            return False
        await (reload or self.reload)()
        log.info("endpoint_config_reloaded", version=version, was=self.version)
        self.version = version
        return True

    async def close(self) -> None:
        self._closing = True
        await self._task.stop(STOP_S)
