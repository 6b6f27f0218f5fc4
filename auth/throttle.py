"""The failed-authentication budget: how the application counts refusals of a client's keys.

A `FailureBudget` counts one refusal (any 401: a missing, malformed, unknown, revoked or expired key) against
the real client (`auth.forwarded`, an IPv6 client by its /64) and says how long that client must wait once it
has spent its budget; every failed attempt is then a 429 instead of a 401, so a guesser learns nothing and must
wait. A valid key is never refused (many customers may share one address, and a 160-bit secret is not guessed
anyway). It is the one rule: the gateway's is a window of its limiter of `rejections_per_minute` per client
address (in Redis when configured, so a fleet shares it: gateway/serving/rejections.py). An AuthService opened
without one does not throttle.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

# client -> count one refusal; the seconds the client must wait when it is over its budget, else None
FailureBudget = Callable[[str], Awaitable[float | None]]
