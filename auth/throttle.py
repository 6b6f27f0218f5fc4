"""Per-client throttling of failed authentication attempts (brute-force protection).

A token bucket per client (the real client: `auth.forwarded`, an IPv6 client counted by its /64): `burst`
failures at once, then `per_minute` more each minute. While the bucket is empty every failed attempt from that
client gets 429 instead of 401, so a guesser learns nothing and must wait; a valid key is never refused (many
customers may share one address, and a 160-bit secret is not guessed anyway). State is per process and bounded
in size.

Beside it, the application may pass a `FailureBudget`: a count of refusals per client shared beyond this
process (the gateway's is a window of its limiter, in Redis when configured: gateway/serving/rejections.py).
Every 401 counts against it, a missing key included; once it is spent, the refusal is a 429 as well.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from auth.forwarded import client_group

# client -> count one refusal; the seconds the client must wait when it is over its budget, else None
FailureBudget = Callable[[str], Awaitable[float | None]]


class FailureThrottle:
    def __init__(self, burst: int = 10, per_minute: float = 10.0, max_clients: int = 100_000) -> None:
        self.burst = float(burst)
        self.rate = per_minute / 60.0
        self._max = max_clients
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, updated_at)

    def _tokens(self, client: str, now: float) -> float:
        entry = self._buckets.get(client)
        if entry is None:
            return self.burst
        tokens, updated = entry
        return min(self.burst, tokens + (now - updated) * self.rate)

    def retry_after(self, client: str, now: float) -> float | None:
        """Seconds until this client may try again, or None when it may try now."""
        client = client_group(client)
        if client not in self._buckets:
            return None
        tokens = self._tokens(client, now)
        if tokens >= 1.0:
            return None
        return (1.0 - tokens) / self.rate if self.rate > 0 else 3600.0

    def failed(self, client: str, now: float) -> None:
        client = client_group(client)
        tokens = self._tokens(client, now) - 1.0
        buckets = self._buckets
        buckets.pop(client, None)
        if len(buckets) >= self._max:
            del buckets[next(iter(buckets))]
        buckets[client] = (max(tokens, 0.0), now)
