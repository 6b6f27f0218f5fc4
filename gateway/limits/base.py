"""The limiter interface the gateway calls, and the factory that picks a backend from the config."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gateway.limits.clock import Clock
from gateway.limits.model import Ticket
from gateway.limits.outage import OutagePolicy
from gateway.limits.scope import LimitScope

if TYPE_CHECKING:  # redis is imported only when it is configured
    from redis.credentials import CredentialProvider


class Limiter(Protocol):
    async def admit(self, scopes: list[LimitScope], tokens: int, sequences: int = 1) -> Ticket:
        """Check every scope atomically (the tightest wins) and reserve 1 request, `tokens` tokens and
        `sequences` concurrency slots in each (the sequences the request generates, at most the scope's
        max_concurrency: a request bigger than the cap runs alone), or nothing. Raises LimitExceeded, or
        LimiterUnavailable (Redis down and failing closed)."""
        ...

    async def settle(self, ticket: Ticket, used_tokens: int) -> None:
        """Release the concurrency slots and charge the actual count: reserved-but-unused tokens go back to
        the TPM window. Idempotent; never raises for a backend outage."""
        ...

    async def close(self) -> None: ...

    @property
    def degraded(self) -> str | None:
        """None while the limits hold exactly; during a shared backend's outage, the policy in force (outage.py):
        `local` (each gateway a share of the limits), `closed` (every admission refused) or `open` (unlimited)."""
        ...


def open_limiter(redis_url: str | None, *, on_outage: OutagePolicy = "closed", outage_gateways: int = 1,
                 fail_open: bool = False, clock: Clock | None = None,
                 concurrency_lease: float = 900.0, concurrency_retry: float = 1.0,
                 key_prefix: str = "sluice:rl", credentials: CredentialProvider | None = None) -> Limiter:
    """None -> in-process (one gateway); ``redis://…`` -> shared by every gateway using that server.

    concurrency_lease: seconds after which an unsettled slot is reclaimed (a crashed gateway); the gateway
    passes its `request_timeout_s` plus a margin (Settings.concurrency_lease_s), so no live request outlives it.
    concurrency_retry: the Retry-After hint for a concurrency refusal.
    on_outage, outage_gateways: what a Redis limiter does while Redis cannot be reached (outage.py); fail_open=True
    is the older spelling of on_outage="open".
    credentials: what signs in to Redis at each new connection (ElastiCache IAM, gateway/redis_iam.py); None:
    the URL's own user and password, if any.
    """
    if redis_url is None:
        from gateway.limits.memory import InProcessLimiter

        return InProcessLimiter(clock, concurrency_lease=concurrency_lease, concurrency_retry=concurrency_retry)
    from gateway.limits.redis_limiter import (
        RedisLimiter,  # imports redis only when it is configured
    )

    return RedisLimiter(redis_url, on_outage=on_outage, outage_gateways=outage_gateways, fail_open=fail_open,
                        clock=clock, concurrency_lease=concurrency_lease,
                        concurrency_retry=concurrency_retry, key_prefix=key_prefix, credentials=credentials)
