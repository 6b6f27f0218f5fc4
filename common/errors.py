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
import re
from typing import Any

# every answer with one of these says when to retry (Retry-After); 529 is Anthropic's "overloaded", our 429
RETRY_STATUSES = (429, 503, 529)


class SluiceError(Exception):
    status = 500
    type = "internal_error"
    code: str | None = None
    # the Retry-After of a 429 or 503 raised without one; None: no wait can cure it (say x-should-retry: false)
    retry_after_s: float | None = 1.0

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}
        self.fields: dict[str, str] = {}

    def response_headers(self) -> dict[str, str]:
        """Its headers as answered: a 429 or a 503 always carries Retry-After, so a client knows when to
        come back (SDKs honour it) instead of retrying at once or giving up."""
        if self.status in RETRY_STATUSES and self.retry_after_s is not None \
                and not any(name.lower() == "retry-after" for name in self.headers):
            return {**self.headers, **retry_after_header(self.retry_after_s)}
        return self.headers


def retry_after_seconds(seconds: float) -> int:
    """Retry-After's value for a wait of `seconds`: whole seconds rounded up (never early), at least 1."""
    return max(1, math.ceil(seconds))


def retry_after_header(seconds: float, *, ms: bool = False) -> dict[str, str]:
    """The Retry-After header for a wait of `seconds` (every answer that says when to retry uses this); `ms`:
    also `retry-after-ms`, the exact wait the OpenAI SDKs prefer (rate-limit refusals send it)."""
    header = {"retry-after": str(retry_after_seconds(seconds))}
    if ms:
        header["retry-after-ms"] = str(math.ceil(seconds * 1000))
    return header


_PATH = re.compile(r"at `\$\.([^`\[]+)")  # up to the first index: `$.messages[0].role` -> messages
_NAMED = re.compile(r"(?:missing required|unknown) field `([^`]+)`")


def invalid_field(error: Exception, *, top_level: bool = True) -> str | None:
    """The body field a msgspec validation error is about, for an envelope's `param`. `top_level` (the dialects,
    as OpenAI names it): the first step of the error's path (`... - at `$.messages[0].role``: messages), else
    the missing or unknown field it names. Otherwise (the admin API): the field named, else the whole path
    (`limits.rpm`)."""
    message = str(error)
    path, named = _PATH.search(message), _NAMED.search(message)
    if top_level:
        return path.group(1).split(".")[0] if path else named.group(1) if named else None
    return named.group(1) if named else path.group(1) if path else None


class BadRequest(SluiceError):
    status, type, code = 400, "invalid_request_error", "bad_request"


class InvalidJSON(BadRequest):
    code = "invalid_json"


class BodyIncomplete(SluiceError):
    """The connection ended before the body did: the client left, or the gateway cut it at its body read
    timeout (and answered 408 itself). A refusal, not a fault: nobody reads this answer."""

    status, type, code = 408, "timeout", "body_incomplete"


class PayloadTooLarge(SluiceError):
    status, type, code = 413, "invalid_request_error", "payload_too_large"


class UnsupportedMediaType(SluiceError):
    status, type, code = 415, "invalid_request_error", "unsupported_media_type"


class LedgerUnavailable(SluiceError):
    """The usage ledger cannot make records durable (its disk is full or failing): nothing is served that
    could not be billed. Service resumes by itself once the disk takes writes again."""

    status, type, code = 503, "service_unavailable", "ledger_unavailable"

    def __init__(self, message: str, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.headers.update(retry_after_header(5))


class StoreUnavailable(SluiceError):
    """A database the request needs cannot be reached (down, restarting, out of connections): retry later."""

    status, type, code = 503, "service_unavailable", "store_unavailable"
    retry_after_s = 5.0
