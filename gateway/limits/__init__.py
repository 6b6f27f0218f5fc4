"""Rate limits, concurrency caps, and the budget book (tokens and money); see README.md in this folder."""

from gateway.limits.base import Limiter, open_limiter
from gateway.limits.model import LimiterUnavailable, LimitExceeded, Ticket
from gateway.limits.scope import LimitScope
from gateway.limits.tokens import reservation_tokens

__all__ = ["Limiter", "LimiterUnavailable", "LimitExceeded", "LimitScope", "Ticket", "open_limiter",
           "reservation_tokens"]
