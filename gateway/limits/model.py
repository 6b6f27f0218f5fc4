"""The limiter's vocabulary: what admission returns (Ticket), how it refuses."""

from __future__ import annotations

from typing import Any, Literal

from gateway.limits.headers import rate_headers

Kind = Literal["rate_limit", "never_fits", "concurrency"]


class LimitExceeded(Exception):
    """The request is not admitted now.

    kind: ``rate_limit`` (RPM/TPM window full), ``concurrency`` (too many in flight), ``never_fits`` (the
    reservation exceeds a limit itself, so retrying cannot help). A spent budget is the budget book's
    ``BudgetSpent`` (budgets.py). retry_after: seconds until the request would be admitted if nothing
    else happened meanwhile, None when never. headers: ``retry-after``/``retry-after-ms`` (when retry_after
    is known) and the x-ratelimit-* trios, ready to put on the 429.
    """

    def __init__(self, kind: Kind, message: str, retry_after: float | None, headers: dict[str, str]):
        super().__init__(message)
        self.kind: Kind = kind
        self.message = message
        self.retry_after = retry_after
        self.headers = headers

    def __repr__(self) -> str:
        return f"LimitExceeded({self.kind!r}, {self.message!r}, retry_after={self.retry_after!r})"


class LimiterUnavailable(Exception):
    """The shared backend (Redis) cannot be reached and the limiter fails closed: answer 503, not 429."""


class Ticket:
    """One admitted request. Pass it back to ``Limiter.settle`` exactly once (a second settle is a no-op).

    ``degraded`` is True when the limiter failed open during a backend outage: nothing was reserved.
    """

    __slots__ = ("id", "tokens", "degraded", "settled", "_snapshot", "_headers", "_hold")

    def __init__(self, id: str, tokens: int, snapshot: Any = None, hold: Any = None, *, degraded: bool = False):
        self.id = id
        self.tokens = tokens
        self.degraded = degraded
        self.settled = False
        self._snapshot = snapshot  # (now_us, per-scope usage) taken at admission, turned into headers lazily
        self._headers: dict[str, str] | None = None
        self._hold = hold  # backend-private: what settle must release

    def headers(self) -> dict[str, str]:
        """x-ratelimit-{limit,remaining,reset}-{requests,tokens} as of admission (tightest scope per trio)."""
        if self._headers is None:
            self._headers = rate_headers(*self._snapshot) if self._snapshot is not None else {}
        return dict(self._headers)

    def __repr__(self) -> str:
        return f"Ticket({self.id!r}, tokens={self.tokens}, degraded={self.degraded})"
