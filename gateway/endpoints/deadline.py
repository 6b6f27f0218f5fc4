"""How long a request may wait for a replica: the endpoint's bound, the request's own deadline, and the
client's optional `X-Scale-Up-Timeout: <seconds>` header (Hugging Face Inference Endpoints' name)."""

from __future__ import annotations

import math
import re

from gateway.errors import BadRequest

SCALE_UP_TIMEOUT_HEADER = b"x-scale-up-timeout"  # as ASGI gives header names: lowercase bytes
MAX_SCALE_UP_TIMEOUT_S = 86400.0
_SECONDS = re.compile(r"[0-9]{1,12}(\.[0-9]{1,9})?")


def parse_scale_up_timeout(value: str | None) -> float | None:
    """Seconds from the header (absent: None). Decimal seconds only, 0 (do not wait) up to a day;
    anything else is a 400 naming the header."""
    if value is None:
        return None
    text = value.strip()
    if not _SECONDS.fullmatch(text) or float(text) > MAX_SCALE_UP_TIMEOUT_S:
        raise BadRequest(f"the X-Scale-Up-Timeout header must be a number of seconds from 0 to "
                         f"{MAX_SCALE_UP_TIMEOUT_S:g} (got {value[:40]!r})", param="X-Scale-Up-Timeout",
                         code="invalid_header")
    return float(text)


def wait_deadline(now: float, now_unix: float, *, max_wait_s: float, header_s: float | None = None,
                  request_deadline_unix: float | None = None) -> float:
    """The moment (on the clock `now` was read from) the request stops waiting for a replica."""
    budget = max_wait_s
    if header_s is not None:
        budget = min(budget, header_s)
    if request_deadline_unix is not None and math.isfinite(request_deadline_unix):
        budget = min(budget, request_deadline_unix - now_unix)
    return now + max(budget, 0.0)
