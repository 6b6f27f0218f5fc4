"""Turns what a backend observed into a refusal: which kind, which message, when to come back.

Both backends call this, so the in-process and Redis limiters refuse in the same words.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from common.errors import retry_after_header
from gateway.limits.headers import (
    Usage,
    limit_only_headers,
    rate_headers,
)
from gateway.limits.metrics import REJECTIONS
from gateway.limits.model import LimitExceeded
from gateway.limits.scope import LimitScope

# what blocked, in which scope, µs until it clears (None = unknown), and the observed amount in use
Failure = tuple[str, LimitScope, int | None, int]

# Kinds by precedence (budgets are the budget book's, checked before the limiter: budgets.py).
_PRECEDENCE = ("rate_limit", "concurrency")
_KIND = {"rpm": "rate_limit", "tpm": "rate_limit", "concurrency": "concurrency"}


def refuse_impossible(scopes: Sequence[LimitScope], tokens: int) -> None:
    """Checks both backends make before touching any state: a negative count, or a reservation that no
    window could ever hold (retrying cannot help, so no Retry-After)."""
    if tokens < 0:
        raise ValueError("tokens must be >= 0")
    impossible = never_fits(scopes, tokens)
    if impossible is not None:
        REJECTIONS.labels("never_fits").inc()
        raise impossible


def never_fits(scopes: Sequence[LimitScope], tokens: int) -> LimitExceeded | None:
    """A reservation larger than a limit itself can never be admitted: say so instead of a retry loop."""
    reasons = []
    for s in scopes:
        if s.rpm is not None and s.rpm < 1:
            reasons.append(f"{s.id} allows no requests (rpm={s.rpm})")
        if s.max_concurrency is not None and s.max_concurrency < 1:
            reasons.append(f"{s.id} allows no concurrent requests (max_concurrency={s.max_concurrency})")
        if s.tpm is not None and tokens > s.tpm:
            reasons.append(f"this request reserves {tokens} tokens (prompt + max new tokens x sequences), "
                           f"more than the {s.tpm} tokens-per-minute limit of {s.id}")
    if not reasons:
        return None
    message = ("Request can never be admitted: " + "; ".join(reasons)
               + ". Lower max_tokens (or n / beams) or shorten the prompt; retrying will not help.")
    return LimitExceeded("never_fits", message, None, limit_only_headers(scopes))


def _describe(failure: Failure, tokens: int) -> str:
    what, s, _, amount = failure
    if what == "rpm":
        return f"{s.id} has made {amount} of its {s.rpm} requests per minute"
    if what == "tpm":
        return (f"{s.id} has {amount} of its {s.tpm} tokens per minute reserved and this request "
                f"reserves {tokens}")
    return (f"{s.id} has {amount} of its {s.max_concurrency} concurrent sequences in flight (each prompt's "
            f"every choice, candidate or beam counts one)")


def reject(failures: Sequence[Failure], tokens: int, now_us: int, window_us: int, usage: Iterable[Usage],
           concurrency_retry_us: int) -> LimitExceeded:
    """The request is admitted only once every failure has cleared, so Retry-After is the latest of them."""
    kinds = {_KIND[f[0]] for f in failures}
    kind = next(k for k in _PRECEDENCE if k in kinds)
    waits = [f[2] if f[2] is not None else concurrency_retry_us for f in failures]
    retry_us = max(waits)
    retry_after = retry_us / 1_000_000
    ordered = sorted(failures, key=lambda f: _PRECEDENCE.index(_KIND[f[0]]))
    head = {"rate_limit": "Rate limit reached", "concurrency": "Too many concurrent requests"}[kind]
    note = " (in-flight requests must finish first; this is a polling hint)" if kind == "concurrency" else ""
    message = (f"{head}: " + "; ".join(_describe(f, tokens) for f in ordered)
               + f". Retry after {retry_after:.3f} s{note}.")
    headers = rate_headers(now_us, window_us, usage)
    headers.update(retry_after_header(retry_after, ms=True))
    return LimitExceeded(kind, message, retry_after, headers)  # type: ignore[arg-type]
