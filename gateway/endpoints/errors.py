"""Errors of the endpoint layer, in the gateway's one hierarchy (each dialect renders them its own way)."""

from __future__ import annotations

from billing.bounds import MAX_NAME_CHARS, trim
from common.errors import retry_after_header, retry_after_seconds
from gateway.errors import NotFound, SluiceError, Unavailable, ValidationFailed


class EndpointNotFound(NotFound):
    """No such endpoint, or a private one of another team (which must not learn that it exists)."""

    def __init__(self, name: str):
        # the name as the ledger keeps it: a caller's 1 MB name is not echoed back in full
        super().__init__(f"the model {trim(name, MAX_NAME_CHARS)!r} does not exist")


class EndpointConflict(SluiceError):
    status, type, code = 409, "invalid_request_error", "endpoint_conflict"


class InvalidEndpoint(ValidationFailed):
    code = "invalid_endpoint"


class EndpointUnavailable(Unavailable):
    """No replica could take the request: the queue is full, the wait ran out, or the endpoint failed.

    Carries the endpoint's state (`scaled_to_zero`, `starting`, `ready`, `draining`, `failed`), the
    failure reason if any, and a Retry-After value, which every dialect envelope shows to the client
    (`endpoint_state`, `endpoint_reason`)."""

    def __init__(self, message: str, *, code: str, state: str, retry_after: float, reason: str | None = None):
        self.retry_after = retry_after_seconds(retry_after)
        super().__init__(message, code=code, headers=retry_after_header(retry_after))
        self.state = state
        self.reason = reason
        self.fields = {"endpoint_state": state, **({"endpoint_reason": reason} if reason else {})}
