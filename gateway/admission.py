"""Admission of a parsed request against its key's and its team's limits: which scopes apply, how many
tokens to reserve; a refusal is the 429 (503 while the limiter is unavailable and fails closed)."""

from __future__ import annotations

from auth import Principal
from gateway.dialects.base import Parsed
from gateway.errors import NeverFits, QuotaExceeded, RateLimited, Unavailable
from gateway.limits import Limiter, LimiterUnavailable, Scope, Ticket, reservation_tokens
from gateway.limits import RateLimited as LimitExceeded
from gateway.routing.pool import Router


async def admit(limiter: Limiter, router: Router, principal: Principal, parsed: Parsed) -> Ticket:
    """Reserve against every limit of the key and the team, or raise the refusal."""
    return await admit_tokens(limiter, principal, reservation(router, parsed), sequences(parsed))


async def admit_tokens(limiter: Limiter, principal: Principal, tokens: int, sequences: int = 1) -> Ticket:
    """One request, `tokens` tokens and `sequences` concurrency slots against every limit of the key and the
    team (a tokenizer call reserves no tokens and one slot), or raise the refusal."""
    try:
        return await limiter.admit(scopes(principal), tokens, sequences)
    except LimitExceeded as refusal:
        kind = {"budget": QuotaExceeded, "never_fits": NeverFits}.get(refusal.kind, RateLimited)
        raise kind(refusal.message, headers=refusal.headers) from refusal
    except LimiterUnavailable as exc:
        raise Unavailable("rate limiting is unavailable; retry shortly", code="limiter_unavailable") from exc


def scopes(principal: Principal) -> list[Scope]:
    found = []
    for prefix, owner, limits in (("key", principal.key_id, principal.key_limits),
                                  ("team", principal.team_id, principal.team_limits)):
        if limits is not None:
            found.append(Scope(id=f"{prefix}:{owner}", rpm=limits.rpm, tpm=limits.tpm,
                               max_concurrency=limits.max_concurrency,
                               monthly_token_budget=limits.monthly_token_budget))
    return found


def sequences(parsed: Parsed) -> int:
    """The sequences a request generates (what max_concurrency counts): per prompt, its n, best_of or beams."""
    return sum(max(r.params.best_of or r.params.n, r.params.num_beams) for r in parsed.requests)


def reservation(router: Router, parsed: Parsed) -> int:
    """Tokens to reserve: a prompt upper bound plus every candidate's maximum new tokens."""
    pool = router.pool(parsed.model)
    info = pool.info() if pool else None
    context = info.max_context if info else 4096
    total = 0
    for request in parsed.requests:
        if request.prompt_ids is not None:
            prompt = len(request.prompt_ids)
        else:  # a token is at least one UTF-8 byte, plus a few special tokens
            text = request.prompt or "".join(str(m.get("content", "")) for m in request.messages or [])
            prompt = len(text.encode()) + 16
        prompt = min(prompt, context)
        params = request.params
        new = params.max_tokens if params.max_tokens is not None else context - prompt
        if params.max_total_tokens is not None:
            new = params.max_total_tokens - prompt
        # no candidate outgrows the context: an impossible max_tokens is the worker's 422 naming the field,
        # not a limiter refusal for a reservation nothing could ever use
        new = min(new, context - prompt)
        total += reservation_tokens(prompt, max(new, 0), n=params.n, best_of=params.best_of,
                                    num_beams=params.num_beams)
    return total
