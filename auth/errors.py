"""The errors the auth package raises, on the shared hierarchy (`common.errors`): the gateway renders them
in the envelope of the route that raised them."""

from __future__ import annotations

from common.errors import SluiceError, StoreUnavailable, retry_after_header

__all__ = ["AuthError", "RequestError", "StoreUnavailable"]

_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          409: "conflict_error", 429: "rate_limit_exceeded"}


class AuthError(SluiceError):
    """A request could not be authenticated (401), is not allowed (403) or is throttled (429)."""

    def __init__(self, status: int, code: str, message: str, retry_after_s: float | None = None) -> None:
        headers = retry_after_header(retry_after_s) if retry_after_s is not None else None
        super().__init__(message, code=code, headers=headers)
        self.status = status
        self.type = _TYPES.get(status, "invalid_request_error")
        self.retry_after = retry_after_s

    @classmethod
    def invalid_key(cls, message: str = "Invalid API key.") -> AuthError:
        return cls(401, "invalid_api_key", message)

    @classmethod
    def denied(cls, message: str) -> AuthError:
        return cls(403, "permission_denied", message)


class RequestError(SluiceError):
    """An admin request is malformed, names something that does not exist or is over a bound (4xx, never
    401/403); `retry_after_s`: when a 429 may be tried again."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None,
                 retry_after_s: float | None = None) -> None:
        if param and param not in message:
            message = f"{param}: {message}"  # the message always names the field
        headers = retry_after_header(retry_after_s) if retry_after_s is not None else None
        super().__init__(message, param=param, code=code, headers=headers)
        self.status = status
        self.type = _TYPES.get(status, "invalid_request_error")
