"""The worker's refusal of a request, raised before it is queued."""

from __future__ import annotations

from common.protocol import Error


class RequestRejected(ValueError):
    """A request the worker refuses; `kind` (a protocol ErrorKind) maps to a status in every dialect."""

    def __init__(self, message: str, field: str | None = None, kind: str = "validation",
                 sizes: dict[str, int | None] | None = None):
        super().__init__(message)
        self.message, self.field, self.kind = message, field, kind
        self.sizes = sizes or {}  # kind "too_long": max_context, prompt_tokens, max_tokens (common.protocol.Error)

    def event(self) -> Error:
        """The refusal as the protocol carries it."""
        return Error(kind=self.kind, message=self.message, field=self.field, **self.sizes)
