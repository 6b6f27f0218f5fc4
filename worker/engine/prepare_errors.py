"""The worker's refusal of a request, raised before it is queued."""

from __future__ import annotations


class RequestError(ValueError):
    """A request the worker refuses; `kind` (a protocol ErrorKind) maps to a status in every dialect."""

    def __init__(self, message: str, field: str | None = None, kind: str = "validation"):
        super().__init__(message)
        self.message, self.field, self.kind = message, field, kind
