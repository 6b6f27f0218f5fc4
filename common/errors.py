"""The one error hierarchy of the gateway, auth and billing packages.

An error carries what any envelope needs: the HTTP `status`, an OpenAI-style `type` and `code`, the
offending `param`, response `headers` (Retry-After), and `fields` every envelope adds beside its message
(an endpoint's state when it cannot serve). It never renders itself: each gateway dialect
turns it into its own envelope (`gateway.dialects`), so auth and billing raise these and stay free of HTTP
shapes. Here too are the errors more than one package raises: a body that cannot be read as JSON
(`common.json_body`) and a store that cannot be reached.
"""

from __future__ import annotations

import math


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
        self.fields: dict[str, str] = {}


def retry_after_header(seconds: float) -> dict[str, str]:
    """The Retry-After header: whole seconds, at least 1."""
    return {"retry-after": str(max(1, math.ceil(seconds)))}


class BadRequest(SluiceError):
    status, type, code = 400, "invalid_request_error", "bad_request"


class InvalidJSON(BadRequest):
    code = "invalid_json"


class PayloadTooLarge(SluiceError):
    status, type, code = 413, "invalid_request_error", "payload_too_large"


class UnsupportedMediaType(SluiceError):
    status, type, code = 415, "invalid_request_error", "unsupported_media_type"


class StoreUnavailable(SluiceError):
    """A database the request needs cannot be reached (down, restarting, out of connections): retry later."""

    status, type, code = 503, "service_unavailable", "store_unavailable"
