"""OpenAI-style rate-limit headers: x-ratelimit-{limit,remaining,reset}-{requests,tokens}.

Each trio describes the tightest scope for that dimension (fewest remaining; ties -> smaller limit).
``reset`` is the time until the oldest reservation still in that scope's window leaves it, i.e. when
``remaining`` next grows; when remaining is 0 it is exactly when one more request would fit.
A dimension no scope limits gets no trio.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.limits.scope import LimitScope

# (scope, requests in window, tokens in window, oldest entry's time in µs or None)
Usage = tuple["LimitScope", int, int, "int | None"]


def go_duration(us: int) -> str:
    """Go's time.Duration spelling as OpenAI sends it ("20ms", "1s", "1.5s", "6m0s"), rounded up to the ms."""
    ms = -(-us // 1000)
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    if ms == 60_000:  # the common answer right after an admission
        return "1m0s"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs, frac = divmod(rest, 1000)
    text = f"{secs}.{frac:03d}".rstrip("0") if frac else str(secs)
    if hours:
        return f"{hours}h{minutes}m{text}s"
    if minutes:
        return f"{minutes}m{text}s"
    return f"{text}s"


def rate_headers(now_us: int, window_us: int, usage: Iterable[Usage]) -> dict[str, str]:
    req = tok = None  # (remaining, limit, reset_us) of the tightest scope so far; plain compares: hot path
    for scope, count, tokens, oldest in usage:
        reset = oldest + window_us - now_us if oldest is not None else 0
        limit = scope.rpm
        if limit is not None:
            left = limit - count if count < limit else 0
            if req is None or left < req[0] or (left == req[0] and limit < req[1]):
                req = (left, limit, reset)
        limit = scope.tpm
        if limit is not None:
            left = limit - tokens if tokens < limit else 0
            if tok is None or left < tok[0] or (left == tok[0] and limit < tok[1]):
                tok = (left, limit, reset)
    out: dict[str, str] = {}
    if req is not None:
        out["x-ratelimit-limit-requests"] = str(req[1])
        out["x-ratelimit-remaining-requests"] = str(req[0])
        out["x-ratelimit-reset-requests"] = go_duration(req[2])
    if tok is not None:
        out["x-ratelimit-limit-tokens"] = str(tok[1])
        out["x-ratelimit-remaining-tokens"] = str(tok[0])
        out["x-ratelimit-reset-tokens"] = go_duration(tok[2])
    return out


def limit_only_headers(scopes: Sequence[LimitScope]) -> dict[str, str]:
    """Trios for a request refused before any state was read (never_fits): limits, full remaining."""
    return rate_headers(0, 0, [(s, 0, 0, None) for s in scopes])
