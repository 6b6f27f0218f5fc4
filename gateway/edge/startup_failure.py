"""A start-up failure found once the server is already listening (a worker whose model cannot load):
say it in one line on stderr, stop the way SIGTERM does (workers stopped, stores closed), and make
`sluice serve` exit non-zero. An app run any other way (in-process by a test, under another server) only
records the failure: signalling the host process would take down whatever else it runs."""

from __future__ import annotations

import sys
from collections.abc import Callable

_failures: list[str] = []
_stop: list[Callable[[], None]] = []


def on_failure(stop: Callable[[], None]) -> None:
    """How to stop the server gracefully (`sluice serve` sets its uvicorn server's exit flag)."""
    _stop[:] = [stop]


def fail(message: str) -> None:
    if not _failures:
        print(f"sluice serve: {message}", file=sys.stderr, flush=True)
    _failures.append(message)
    if _stop:
        _stop[0]()


def exit_status() -> int:
    return 1 if _failures else 0
