"""The failed-authentication budget: how the application counts refusals of a client's keys.

A `FailureBudget` counts one refusal (any 401: a missing, malformed, unknown, revoked or expired key) against
the real client (`auth.forwarded`, an IPv6 client by its /64) and says how long that client must wait once it
has spent its budget; every failed attempt is then a 429 instead of a 401, so a guesser learns nothing and must
wait. A valid key is never refused (many customers may share one address, and a 160-bit secret is not guessed
anyway). It is the one rule: the gateway's is a window of its limiter of `rejections_per_minute` per client
address (in Redis when configured, so a fleet shares it: gateway/serving/rejections.py). An AuthService opened
without one does not throttle.

`SpentKeys` is the other side of that budget: the keys whose own refusals have spent it (the gateway tells it
so when it answers one with a 429). A spent key is refused at authentication, before its request's body is read,
until its window frees: a key that keeps sending what is refused (a 2 MB body of 400k ids, say) then costs the
gateway a key lookup, not a read and a parse each time. Per process: every gateway of a fleet learns it from its
own first 429 of that key, the count itself being the fleet's.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

# client -> count one refusal; the seconds the client must wait when it is over its budget, else None
FailureBudget = Callable[[str], Awaitable[float | None]]


class SpentKeys:
    """Key id -> when it may be heard again (monotonic). Bounded by the keys that exist, and swept of those
    whose wait is over as it grows."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._until: dict[str, float] = {}
        self._sweep_at = 1024  # entries

    def hold(self, key_id: str, seconds: float) -> None:
        """`key_id` spent its budget: refused for `seconds` (the limiter's wait until its window frees)."""
        now = self._clock()
        self._until[key_id] = max(self._until.get(key_id, now), now + seconds)
        if len(self._until) >= self._sweep_at:
            self._until = {key: until for key, until in self._until.items() if until > now}
            self._sweep_at = max(1024, 2 * len(self._until))

    def wait(self, key_id: str) -> float | None:
        """The seconds `key_id` must still wait, or None when it may be heard."""
        until = self._until.get(key_id)
        if until is None:
            return None
        left = until - self._clock()
        if left > 0:
            return left
        del self._until[key_id]
        return None
