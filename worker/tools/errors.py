"""A tool-calling request the worker refuses; prepare turns it into a RequestRejected naming `field`."""

from __future__ import annotations


class ToolError(ValueError):
    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.message, self.field = message, field
