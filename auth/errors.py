"""The two errors the auth package raises, and their rendering as an OpenAI-style envelope."""

from __future__ import annotations

_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
          409: "conflict_error", 429: "rate_limit_error"}


class AuthError(Exception):
    """A request could not be authenticated (401), is not allowed (403) or is throttled (429)."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.param: str | None = None

    @classmethod
    def invalid_key(cls, message: str = "Invalid API key.") -> AuthError:
        return cls(401, "invalid_api_key", message)

    @classmethod
    def denied(cls, message: str) -> AuthError:
        return cls(403, "permission_denied", message)


class RequestError(Exception):
    """An admin request is malformed or names something that does not exist (4xx, never 401/403)."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        if param and param not in message:
            message = f"{param}: {message}"  # the message always names the field
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.retry_after: float | None = None


def error_type(status: int) -> str:
    return _TYPES.get(status, "invalid_request_error")


def envelope(exc: AuthError | RequestError) -> dict:
    """The body every auth error is rendered with: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": exc.message, "type": error_type(exc.status), "param": exc.param,
                      "code": exc.code}}
