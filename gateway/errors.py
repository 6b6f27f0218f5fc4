"""One error hierarchy for the gateway; each dialect maps these to its own status codes and envelope."""

from __future__ import annotations


class SluiceError(Exception):
    status = 500
    type = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}


class BadRequest(SluiceError):
    status, type, code = 400, "invalid_request_error", "bad_request"


class InvalidJSON(BadRequest):
    code = "invalid_json"


class ValidationFailed(SluiceError):
    status, type, code = 422, "invalid_request_error", "invalid_value"


class Unauthorized(SluiceError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class Forbidden(SluiceError):
    status, type, code = 403, "permission_error", "permission_denied"


class NotFound(SluiceError):
    status, type, code = 404, "not_found_error", "model_not_found"


class PayloadTooLarge(SluiceError):
    status, type, code = 413, "invalid_request_error", "payload_too_large"


class RateLimited(SluiceError):
    status, type, code = 429, "rate_limit_exceeded", "rate_limit_exceeded"


class QuotaExceeded(RateLimited):
    type = code = "insufficient_quota"


class Overloaded(SluiceError):
    """The model's workers cannot take the request now (queue full, deadline missed)."""

    status, type, code = 429, "overloaded_error", "overloaded"


class Unavailable(SluiceError):
    status, type, code = 503, "service_unavailable", "no_ready_worker"


class UpstreamFailed(SluiceError):
    status, type, code = 502, "upstream_error", "worker_failed"


class WorkerLost(UpstreamFailed):
    """The worker went away after part of the answer reached the client: the client gets an error
    event after the tokens it has, and the ledger records exactly those tokens."""

    code = "worker_lost"
