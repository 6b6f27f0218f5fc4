"""One renewal for all the leases a gateway holds on idle endpoints.

An idle endpoint's owner used to renew its lease with a sync of its own every second (its report, the claim, the
reports, the marks, the failure: about 10 Redis commands), so 100 idle endpoints cost ~1,000 commands a second
whatever the number of gateways. Here each gateway renews every lease its idle owners hold in one round trip per
`renew_s` (`Fleet.renew`: one Lua script, or one PostgreSQL statement), fenced per lease as a sync renews it: a
lease that lapsed or that another gateway took is not renewed, and its endpoint syncs at once to learn who holds
it. The idle owner syncs only when told, as the other gateways do (ownership.py): demand on any gateway wakes it
(`Fleet.wake`), a change to its shared state names it (config_follower.py), and the follower's backstop syncs one
quiet endpoint in turn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from gateway.endpoints.fleet import Fleet
from gateway.endpoints.ownership import Ownership
from gateway.endpoints.repeated_failure import RepeatedFailure
from gateway.lifecycle import Background

STOP_S = 5.0  # a renewal under way when the gateway stops gets this long to end


class LeaseRenewal:
    def __init__(self, fleet: Fleet, ownerships: Callable[[], Iterable[Ownership]], *, renew_s: float,
                 lease_s: float):
        """`ownerships`: this gateway's shared endpoints now; those `renewing` are renewed every `renew_s`."""
        self.fleet = fleet
        self.ownerships = ownerships
        self.renew_s = renew_s
        self.lease_s = lease_s
        self.batches = 0  # round trips so far (tests)
        self._task = Background("lease renewal")
        self._closing = False  # a cancel alone may be swallowed (controller.py, `_stop_loop`)
        self._failure = RepeatedFailure("lease_renewal_failed")

    def start(self) -> None:
        self._task.spawn(self._run(), name="lease renewal")

    async def _run(self) -> None:
        while not self._closing:
            try:
                await self.renew_once()
                self._failure.succeeded()
            except Exception as error:  # the shared state is away: the leases lapse, as every sync's would
                self._failure.failed(error)
            await asyncio.sleep(self.renew_s)

    async def renew_once(self) -> None:
        held: list[tuple[Ownership, int]] = []
        for ownership in self.ownerships():
            if ownership.renewing and ownership.token is not None:
                held.append((ownership, ownership.token))
        if not held or self._closing:
            return
        started = time.monotonic()
        renewed = await self.fleet.renew({ownership.endpoint: token for ownership, token in held}, self.lease_s)
        self.batches += 1
        for ownership, token in held:
            if ownership.endpoint in renewed:
                ownership.renewed(token, started)
            elif ownership.renewing and ownership.token == token:  # not one a sync moved on meanwhile
                ownership.not_renewed()

    async def close(self) -> None:
        self._closing = True
        await self._task.stop(STOP_S)
