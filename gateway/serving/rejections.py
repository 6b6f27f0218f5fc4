"""The budget of refused requests: a request refused for what it is (no or a bad key, an unknown model, a malformed
or too large body, a model the key may not use) costs the gateway a read, a parse and, once authenticated, a
usage record, so refusals are counted like requests. Per minute, each client address (the real client:
`auth.forwarded`; an IPv6 client by its /64, `client_group`) and each key may have `rejections_per_minute` of
them; past that the refusal is a 429 with Retry-After in the route's envelope. A valid request is never refused
by this budget.

A worker's refusal of what the request is (a prompt longer than the context, a token id outside the vocabulary,
a grammar that does not compile: `refused_by_worker`) counts too: it cost the worker the prompt's reading and
tokenizing, which the tenant is not billed for.

The windows are the limiter's (`LimitScope` with an rpm, zero tokens), so the in-process and Redis limiters both
keep them, and gateways that share Redis share them.
"""

from __future__ import annotations

from auth import Principal
from auth.forwarded import client_group
from auth.throttle import FailureBudget
from common.errors import retry_after_header
from gateway.errors import BadRequest, NotFound, RateLimited, SluiceError, ValidationFailed
from gateway.limits import Limiter, LimiterUnavailable, LimitExceeded, LimitScope

REFUSED = "Too many rejected requests"


async def over_budget(limiter: Limiter, per_minute: int, subjects: list[str]) -> float | None:
    """Count one refusal against each subject (``key:<id>``, ``address:<ip>``); the seconds to wait when one of
    them had its `per_minute` already, else None (also when the limiter is unavailable: the refusal stands)."""
    try:
        await limiter.admit([LimitScope(id=f"rejections:{subject}", rpm=per_minute) for subject in subjects], 0)
    except LimitExceeded as refusal:
        return refusal.retry_after or 1.0
    except LimiterUnavailable:
        return None
    return None


async def count_rejection(limiter: Limiter, per_minute: int, principal: Principal, client: str,
                          error: SluiceError) -> SluiceError:
    """The refusal to answer for an authenticated request that `error` refuses: `error` itself, or a 429 once
    its key or its address is over budget. A 429 or a server error is not a refusal of what the request is."""
    if not 400 <= error.status < 500 or error.status == 429:
        return error
    wait = await over_budget(limiter, per_minute, [f"key:{principal.key_id}", f"address:{client_group(client)}"])
    if wait is None:
        return error
    return RateLimited(f"{REFUSED}: at most {per_minute} requests of a key or a client address may be refused per "
                       f"minute (this one: {error.status} {error.code}). Retry after {wait:.3f} s.",
                       headers=retry_after_header(wait, ms=True))


def refused_by_worker(error: SluiceError) -> bool:
    """Whether `error`, met once the request was admitted, is a refusal of what the request is (the worker's 4xx
    on its body) rather than of the moment (a deadline that passed, a replica overloaded, a fault)."""
    return isinstance(error, BadRequest | ValidationFailed | NotFound)


def address_budget(limiter: Limiter, per_minute: int) -> FailureBudget:
    """The failure budget the gateway gives its AuthService: every 401 counts against its client address."""
    async def charge(client: str) -> float | None:
        return await over_budget(limiter, per_minute, [f"address:{client_group(client)}"])
    return charge
