"""The secret a worker shares with its gateway: without it, a worker would give unbilled generation to
anyone who can reach its port.

The gateway sends it in the `WORKER_SECRET_HEADER` header of every call. Local workers get one the
gateway generates at each start (in `SLUICE_WORKER_SECRET` of their environment); a remote worker and
its gateway are both given the same `SLUICE_WORKER_SECRET`. Every route needs it but a bare `/health`
(200 or 503, no body), which load balancers and orchestrators probe. A worker bound to an address
other than loopback refuses to start without a secret; on loopback it is optional (local tests, a
gateway on the same host).
"""

from __future__ import annotations

import hmac
import ipaddress

import msgspec
from litestar import Request, Response

from common.protocol import ERROR_STATUS, WORKER_SECRET_ENV, WORKER_SECRET_HEADER, Error

OPEN_PATHS = frozenset({"/health"})
_json = msgspec.json.Encoder()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve to anything
        return False


def bind_refusal(host: str, secret: str | None) -> str | None:
    """Why this worker must not start, or None."""
    if secret or is_loopback(host):
        return None
    return (f"refusing to serve on {host} without a worker secret: set {WORKER_SECRET_ENV} to the value "
            "its gateway has (or bind to 127.0.0.1)")


def secret_guard(secret: str):
    """A Litestar before_request hook answering 401, in the worker's error shape, to a call without it."""
    expected = secret.encode()

    async def guard(request: Request) -> Response | None:
        if request.url.path in OPEN_PATHS:
            return None
        given = request.headers.get(WORKER_SECRET_HEADER, "").encode()
        if hmac.compare_digest(given, expected):
            return None
        message = "missing worker secret" if not given else "wrong worker secret"
        return Response(_json.encode(Error(kind="unauthorized", message=message)),
                        status_code=ERROR_STATUS["unauthorized"],
                        media_type="application/json")

    return guard
