"""The one error an adapter can fail with, carrying the protocol ErrorKind the gateway maps to a status."""

from __future__ import annotations


class AdapterError(Exception):
    """An adapter that cannot be served: `kind` is "not_found" (no such directory, prefix or file),
    "validation" (present but not a LoRA adapter for this model), "unavailable" (storage unreachable)
    or "internal"."""

    def __init__(self, message: str, kind: str = "validation"):
        super().__init__(message)
        self.message, self.kind = message, kind
        self.retry_after_s: float | None = None  # set by the store: how long until it tries loading again
