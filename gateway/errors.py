"""The gateway's errors, on the shared hierarchy (`common.errors`); each dialect maps them to its own status
codes and envelope. `as_sluice_error` brings whatever else a handler raised into the hierarchy."""

from __future__ import annotations

import copy

import structlog
from litestar.exceptions import HTTPException

from common.errors import (
    BadRequest,
    InvalidJSON,
    PayloadTooLarge,
    SluiceError,
    StoreUnavailable,
    UnsupportedMediaType,
)

log = structlog.get_logger("gateway")
UNREADY_RETRY_S = 5.0  # Retry-After while a model has no ready worker (one starting takes seconds)

__all__ = ["AdapterUnavailable", "BadRequest", "ContextTooLong", "GenerationFailed", "InvalidJSON", "NeverFits",
           "NotFound", "Overloaded", "PayloadTooLarge", "QuotaExceeded", "RateLimited", "RequestTimedOut",
           "SluiceError",
           "StoreUnavailable", "Unavailable", "UnknownParameter", "UnsupportedMediaType", "UpstreamFailed",
           "ValidationFailed", "as_sluice_error", "restated"]


class ValidationFailed(SluiceError):
    status, type, code = 422, "invalid_request_error", "invalid_value"


class ContextTooLong(ValidationFailed):
    """The prompt, or the prompt plus the completion it asks room for, exceeds the model's context; the sizes
    let each dialect word it as its real server does (OpenAI's wording is matched by client frameworks)."""

    code = "context_length_exceeded"

    def __init__(self, message: str, *, max_context: int | None = None, prompt_tokens: int | None = None,
                 max_tokens: int | None = None, **kwargs):
        super().__init__(message, **kwargs)
        self.max_context, self.prompt_tokens, self.max_tokens = max_context, prompt_tokens, max_tokens


class UnknownParameter(BadRequest):
    """A body key the route does not know (OpenAI's own answer: 400, "Unrecognized request argument")."""

    code = "unknown_parameter"

    def __init__(self, name: str):
        super().__init__(f"Unrecognized request argument supplied: {name}", param=name)


class NotFound(SluiceError):
    """OpenAI's 404: its type is `invalid_request_error` (the code says what was not found); Anthropic's envelope
    words it by status (`not_found_error`)."""

    status, type, code = 404, "invalid_request_error", "model_not_found"


class RateLimited(SluiceError):
    status, type, code = 429, "rate_limit_exceeded", "rate_limit_exceeded"


class NeverFits(RateLimited):
    """The request alone exceeds a limit (its reservation is over the TPM or the budget itself): no wait
    admits it, so no Retry-After, and `x-should-retry: false` keeps SDKs from retrying it."""

    retry_after_s = None

    def __init__(self, message: str, **kwargs):
        super().__init__(message, **kwargs)
        self.headers = {**self.headers, "x-should-retry": "false"}


class QuotaExceeded(RateLimited):
    """A budget (tokens or money, gateway/serving/budget_gate.py) has no room for the request: OpenAI's
    `insufficient_quota`, not a rate limit. Waiting a moment cannot help, so no Retry-After (the message says when
    the period resets) and `x-should-retry: false`, which openai-python obeys before its own rule of retrying every
    429. Dialects whose service answers exhausted credit otherwise restate it: Anthropic's 402 `billing_error`,
    Hugging Face's 402 for TGI-shaped routes (docs/api.md, "Budgets")."""

    type = code = "insufficient_quota"
    retry_after_s = None

    def __init__(self, message: str, **kwargs):
        super().__init__(message, **kwargs)
        self.headers = {**self.headers, "x-should-retry": "false"}


class Overloaded(SluiceError):
    """The model's workers cannot take the request now (queue full): a slot frees within a step or two."""

    status, type, code = 429, "overloaded_error", "overloaded"
    retry_after_s = 1.0


class DeadlineExceeded(SluiceError):
    """The client's own deadline (`timeout_microseconds`) passed before the answer was complete.

    408 with `x-should-retry: false`: friendli and friendli-client never retry a 408, and openai-python,
    which retries 408, 409, 429 and every 5xx, obeys that header first. A 429 or a 504 would be retried
    with the same deadline, which would pass again.
    """

    status, type, code = 408, "timeout", "deadline_exceeded"

    def __init__(self, message: str, **kwargs):
        super().__init__(message, **kwargs)
        self.headers.setdefault("x-should-retry", "false")


class RequestTimedOut(SluiceError):
    """The request ran past the gateway's `request_timeout_s` (which keeps it inside its concurrency lease).

    504, not retried (`x-should-retry: false`): the same request would run as long again."""

    status, type, code = 504, "timeout", "request_timeout"

    def __init__(self, message: str, **kwargs):
        super().__init__(message, **kwargs)
        self.headers.setdefault("x-should-retry", "false")


class Unavailable(SluiceError):
    status, type, code = 503, "service_unavailable", "no_ready_worker"
    retry_after_s = UNREADY_RETRY_S


class AdapterUnavailable(Unavailable):
    """The request's LoRA adapter could not be loaded (the worker's log and ours name its source; the caller
    only learns when to retry). 503, not 4xx: the name is registered, so the fault is the operator's files or
    storage, and the same request can succeed once they are fixed and the worker's backoff has run."""

    code = "adapter_unavailable"

    def __init__(self, message: str, retry_after_s: float | None):
        super().__init__(message)
        self.retry_after_s = retry_after_s if retry_after_s is not None else UNREADY_RETRY_S


class UpstreamFailed(SluiceError):
    status, type, code = 502, "upstream_error", "worker_failed"


class GenerationFailed(UpstreamFailed):
    """A choice ended by failing, not by a stop or a length (gateway.serving.answer.honest)."""

    code = "generation_failed"


class WorkerLost(UpstreamFailed):
    """The worker went away after part of the answer reached the client: the client gets an error
    event after the tokens it has, and the ledger records exactly those tokens."""

    code = "worker_lost"


class Internal(SluiceError):
    code = "internal_error"


class HTTPError(SluiceError):
    """One of Litestar's own refusals (unknown path, wrong method, bad path or query parameter)."""

    type = "invalid_request_error"

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message, headers=headers)
        self.status = status


def restated(error: SluiceError, status: int) -> SluiceError:
    """A copy of `error` answered with `status` (a dialect's own status for it); the raised error is left as it was."""
    error = copy.copy(error)
    error.status = status
    return error


def as_sluice_error(exc: Exception) -> SluiceError:
    if isinstance(exc, SluiceError):
        return exc
    if isinstance(exc, HTTPException) and exc.status_code < 500:
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.extra and isinstance(exc.extra, list):  # which parameter failed validation, and why
            message = f"{message}: {exc.extra}"
        if exc.status_code == 413:
            return PayloadTooLarge(message)
        return HTTPError(exc.status_code, message, headers=exc.headers)
    log.exception("unhandled_error", error=type(exc).__name__, exc_info=exc)
    return Internal("internal server error")
