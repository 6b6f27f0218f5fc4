"""Admission of a parsed request against its key's and its team's limits: which scopes apply, how many
tokens to reserve; a refusal is the 429 (503 while the limiter is unavailable and fails closed). Budgets are
reserved before, with the same token count (gateway/serving/budget_gate.py)."""

from __future__ import annotations

from auth import Principal
from common.protocol import PromptOverhead
from gateway.errors import ContextTooLong, NeverFits, RateLimited, Unavailable
from gateway.limits import Limiter, LimiterUnavailable, LimitExceeded, LimitScope, Ticket
from gateway.limits.tokens import fewest_prompt_tokens, request_reservation
from gateway.replicas.pool import ReplicaRouter
from gateway.serving.dialect import Parsed

DEFAULT_CONTEXT = 4096  # a model no worker has described yet (ModelConfig's default max_context)


async def admit_tokens(limiter: Limiter, principal: Principal, tokens: int, sequences: int = 1) -> Ticket:
    """One request, `tokens` tokens and `sequences` concurrency slots against every limit of the key and the
    team (a tokenizer call reserves no tokens and one slot), or raise the refusal."""
    try:
        return await limiter.admit(scopes(principal), tokens, sequences)
    except LimitExceeded as refusal:
        kind = NeverFits if refusal.kind == "never_fits" else RateLimited
        raise kind(refusal.message, headers=refusal.headers) from refusal
    except LimiterUnavailable as exc:
        raise Unavailable("rate limiting is unavailable; retry shortly", code="limiter_unavailable") from exc


def scopes(principal: Principal) -> list[LimitScope]:
    found = []
    for prefix, owner, limits in (("key", principal.key_id, principal.key_limits),
                                  ("team", principal.team_id, principal.team_limits)):
        if limits is not None:
            found.append(LimitScope(id=f"{prefix}:{owner}", rpm=limits.rpm, tpm=limits.tpm,
                               max_concurrency=limits.max_concurrency))
    return found


def sequences(parsed: Parsed) -> int:
    """The sequences a request generates (what max_concurrency counts): per prompt, its n, best_of or beams."""
    return sum(max(r.params.best_of or r.params.n, r.params.num_beams) for r in parsed.requests)


def reservation(router: ReplicaRouter, parsed: Parsed) -> int:
    """Tokens to reserve: the most every prompt of the request can be charged (gateway/limits/tokens.py), on the
    model's context and chat template as its workers describe them (defaults for a model none has described)."""
    pool = router.pool(parsed.model)
    info = pool.described() if pool else None
    context = info.max_context if info else DEFAULT_CONTEXT
    overhead = info.prompt_overhead if info else PromptOverhead()
    return sum(request_reservation(request, context, overhead, context_known=info is not None)
               for request in parsed.requests)


def refuse_overflow(router: ReplicaRouter, parsed: Parsed) -> None:
    """ContextTooLong for a prompt that certainly exceeds the model's context as its workers describe it: token
    ids or embeddings by their count, a text by its bytes (gateway/limits/tokens.py). Refused here, before
    admission (a refusal the rejection budget counts), it never reaches a worker, which would read, check and
    tokenize it first. A model none has described is left to its workers; so is a prompt under `truncate`."""
    pool = router.pool(parsed.model)
    info = pool.described() if pool else None
    if info is None:
        return
    for request in parsed.requests:
        if request.params.truncate is not None and request.params.truncate < info.max_context:
            continue
        fewest = fewest_prompt_tokens(request, info.max_token_bytes)
        if fewest >= info.max_context:
            exact = request.prompt is None  # ids and embeddings are counted, a text only bounded
            counted = f"has {fewest}" if exact else f"is {len(request.prompt.encode())} bytes, at least {fewest}"
            raise ContextTooLong(f"the prompt {counted} tokens; this model's context is {info.max_context} tokens",
                                 param="prompt", max_context=info.max_context,
                                 prompt_tokens=fewest if exact else None)
