"""The errors a store's caller may see instead of a driver's: `Conflict` for a write that a constraint refused,
`StoreUnavailable` (503) for a database that is away, so no caller above a store ever sees `sqlite3` or
`asyncpg`."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

import asyncpg

from common.errors import StoreUnavailable

# a refused write is the store's own business (auth maps it to Conflict): never "unavailable"
INTEGRITY_ERRORS = (sqlite3.IntegrityError, asyncpg.IntegrityConstraintViolationError)
DRIVER_FAILURES = (sqlite3.Error, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)


class Conflict(Exception):
    """A unique or foreign-key constraint refused a write."""


@contextlib.contextmanager
def conflicts() -> Iterator[None]:
    """A driver's integrity error inside the block becomes `Conflict`."""
    try:
        yield
    except INTEGRITY_ERRORS as exc:
        raise Conflict(str(exc)) from exc


@contextlib.contextmanager
def unavailable_when_down(store: str, code: str) -> Iterator[None]:
    """Driver failures inside the block raise `StoreUnavailable` (503) naming `store`; the driver's own
    error stays the `__cause__` for logs and start-up messages."""
    try:
        yield
    except INTEGRITY_ERRORS:
        raise
    except DRIVER_FAILURES as exc:
        raise StoreUnavailable(f"the {store} is unavailable; retry shortly", code=code) from exc
