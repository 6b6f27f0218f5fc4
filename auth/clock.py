"""UTC time conversions shared by the admin API and the CLI."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import overload


def now() -> float:
    return time.time()


@overload
def iso(ts: float) -> str: ...
@overload
def iso(ts: None) -> None: ...
@overload
def iso(ts: float | None) -> str | None: ...
def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def parse_iso(value: str) -> float:
    """ISO 8601 → epoch seconds; a value without an offset is UTC. Raises ValueError."""
    parsed = datetime.fromisoformat(value.strip())
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()
