"""The budget of refused requests: a request refused for what it is (no or a bad key, an unknown model, a malformed
or too large body, a model the key may not use) costs the gateway a read, a parse and, once authenticated, a
usage record, so refusals are counted like requests. Per minute, each client address (the real client:
`auth.forwarded`; an IPv6 client by its /64, `client_group`) and each key may have `rejections_per_minute` of
them; past that the refusal is a 429 with Retry-After in the route's envelope.

A key that spends its own budget is held (`auth.throttle.SpentKeys`): until its window frees, every request of
it is a 429 at authentication, before its body is read, valid or not, since reading and parsing what it sends
is the cost the budget bounds. A key within its budget is never refused by it, nor is a valid request of
another key from a spent address: an address may be many customers behind one NAT.

A worker's refusal of what the request is (a prompt longer than the context, a token id outside the vocabulary,
a grammar that does not compile: `refused_by_worker`) counts too: it cost the worker the prompt's reading and
tokenizing, which the tenant is not billed for. So does a 429 `large_bodies_busy` (common/large_bodies.py): a
large body sent while its owner's own large bodies wait to be decoded.

The windows are the limiter's (`LimitScope` with an rpm, zero tokens), so the in-process and Redis limiters both
keep them, and gateways that share Redis share them.
"""

from __future__ import annotations

from litestar import Request

from auth.forwarded import client_group
from auth.throttle import FailureBudget
from common.errors import retry_after_header
from common.large_bodies import LargeBodiesBusy
from gateway.authentication.headers import client_address
from gateway.errors import BadRequest, NotFound, RateLimited, SluiceError, ValidationFailed
from gateway.limits import Limiter, LimiterUnavailable, LimitExceeded, LimitScope
from gateway.serving.services import Services

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


async def count_rejection(services: Services, request: Request, error: SluiceError) -> SluiceError:
    """The refusal to answer for an authenticated request that `error` refuses: `error` itself, or a 429 once
    its key or its (real) client address is over budget; a key over it is held (`SpentKeys`). A 429 or a server
    error is not a refusal of what the request is, but for `large_bodies_busy`: what its owner sends while its
    own large bodies wait."""
    if not 400 <= error.status < 500 or (error.status == 429 and not isinstance(error, LargeBodiesBusy)):
        return error
    limiter, per_minute = services.limiter, services.settings.rejections_per_minute
    key_id = request.user.key_id
    key = f"key:{key_id}"
    address = f"address:{client_group(client_address(request, services.auth.clients))}"
    wait = await over_budget(limiter, per_minute, [key, address])  # within both (the usual case): one call
    if wait is None:
        return error
    # one of them is over and neither was counted: the key alone now, so that only a spent key is held
    if (key_wait := await over_budget(limiter, per_minute, [key])) is not None:
        services.auth.spent_keys.hold(key_id, key_wait)
        wait = key_wait
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
