"""Keeps this gateway equal to the fleet: an admin change on any gateway (stored in the shared database, then
`Fleet.bump_config`) reaches every other one, and so does a change an endpoint's owner makes to its shared state.

The follower waits for the fleet's messages (Redis pub/sub, PostgreSQL LISTEN/NOTIFY), at most until its next
periodic look:
- the config channel, or every `check_s`: it compares the fleet's config version with the one it last loaded and
  reloads on a difference. The version is read before the reload and a change is stored before its bump, so the
  reload sees at least what that version stands for; a message lost (a reconnect, a listener down) delays a change
  by `check_s` at most, it never loses one;
- the state channel (an owner changed an endpoint's replicas, draining marks or failure, or gave up its lease):
  that endpoint syncs at once (`Ownership.changed`); the wake channel (demand appeared on some gateway): the
  endpoint syncs at once where this gateway owns it;
- every `watch_s`, one look at the fleet whatever the number of endpoints (`Fleet.watch`): this gateway is alive
  (its reports count), the fleet's state version (moved without a message that said where: the versions per
  endpoint are read and the changed endpoints sync), the gateways alive (an endpoint whose lease holder is gone,
  or that has none, syncs: it takes the lease), and one endpoint in turn syncs (a backstop), this gateway's idle
  owned endpoints included (their leases are renewed in one batch, lease_renewal.py, and they sync only when told).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

import structlog

from gateway.endpoints.fleet import Changes, Fleet
from gateway.endpoints.ownership import Ownership
from gateway.endpoints.repeated_failure import RepeatedFailure
from gateway.lifecycle import Background

log = structlog.get_logger(__name__)
STOP_S = 5.0  # the longest a stopping gateway waits for a reload in progress


class ConfigFollower:
    def __init__(self, fleet: Fleet, reload: Callable[[], Awaitable[None]], check_s: float, *,
                 ownerships: Callable[[], Iterable[Ownership]] = tuple, watch_s: float = 3.0,
                 alive_s: float = 10.0):
        """`ownerships`: this gateway's shared endpoints now; every `watch_s` it says it is alive for `alive_s`."""
        self.fleet = fleet
        self.reload = reload
        self.check_s = check_s
        self.ownerships = ownerships
        self.watch_s = watch_s
        self.alive_s = alive_s
        self.version: int | None = None  # the version this gateway's endpoints reflect (None: unknown yet)
        self._task = Background("endpoint config follower")
        self.state_version: int | None = None  # the fleet's state version at the last look
        self.watches = 0  # looks at the fleet so far
        self._versions: dict[str, int] = {}  # each endpoint's state version at the last read of them
        self._turn = 0
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
        next_check = next_watch = time.monotonic()
        changes = Changes()
        while not self._closing:
            try:
                now = time.monotonic()
                if changes.config or now >= next_check:
                    next_check = now + self.check_s
                    await self.catch_up()
                if changes.relisten:  # a wake sent before (re)subscribing was lost: idle owners read every report
                    for ownership in self.ownerships():
                        if ownership.renewing:
                            ownership.changed()
                if changes.relisten or now >= next_watch:
                    next_watch = now + self.watch_s
                    await self.watch()
                changes = await self.fleet.changes(max(0.0, min(next_check, next_watch) - time.monotonic()))
                self._dispatch(changes)
                self._failure.succeeded()
            except Exception as error:
                changes = Changes()
                self._failure.failed(error)
                await asyncio.sleep(min(self.check_s, self.watch_s))

    def _dispatch(self, changes: Changes) -> None:
        if not changes.endpoints and not changes.wake:
            return
        for ownership in self.ownerships():
            if ownership.endpoint in changes.endpoints or (ownership.owner and ownership.endpoint in changes.wake):
                ownership.changed()

    async def watch(self) -> None:
        """One look at the fleet (a constant number of commands): alive; what changed unheard; whose lease is free."""
        seen = await self.fleet.watch(self.alive_s)
        self.watches += 1
        ownerships = list(self.ownerships())
        if seen.state_version != self.state_version:
            versions = await self.fleet.state_versions()
            if self.state_version is not None:  # at the first look, every endpoint syncs by itself anyway
                for ownership in ownerships:
                    if versions.get(ownership.endpoint) != self._versions.get(ownership.endpoint):
                        ownership.changed()
            self.state_version, self._versions = seen.state_version, versions
        followed = [o for o in ownerships if not o.owner]
        for ownership in followed:
            if ownership.holder is None or ownership.holder not in seen.alive:
                ownership.changed()  # its lease is free or its holder gone: take it
        quiet = followed + [o for o in ownerships if o.renewing]  # idle owners sync only when told, too
        if quiet:  # a backstop for anything missed: each endpoint in turn
            self._turn = (self._turn + 1) % len(quiet)
            quiet[self._turn].changed()

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
