"""The one error a model source raises when it cannot become a model: the worker prints its message as its
one line at start-up (worker/__main__.py) and exits."""

from __future__ import annotations


class ModelLoadError(RuntimeError):
    """The configured source cannot be turned into a model (missing file, bad format, ...)."""
