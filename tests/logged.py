"""The structlog events a module logs during a test, whatever logging an earlier test in the same process set
up (configure_logging binds its stream and caches loggers, so stdout capture sees nothing after it)."""

from __future__ import annotations

import logging
from types import ModuleType

import pytest
import structlog


def logged(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[dict]:
    """Every event `module.log` emits from now on, as the dict it was logged with (`exc_info` included)."""
    events: list[dict] = []

    def keep(_logger, method: str, event_dict: dict) -> dict:
        events.append({"level": method, **event_dict})
        raise structlog.DropEvent

    monkeypatch.setattr(module, "log", structlog.wrap_logger(
        None, processors=[keep], wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG)))
    return events
