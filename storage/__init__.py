"""The one database layer: `open(url)` gives a store its handle on the shared pool of a URL (SQLite or
PostgreSQL, one driver shape), and `migrate(db, schema)` applies a package's numbered schema versions.
It imports nothing of ours but `common`."""

from storage.database import Database, Executor
from storage.errors import Conflict
from storage.migrations import MigratedOnFirstUse, Migration, Schema, migrate
from storage.registry import open

__all__ = ["Conflict", "Database", "Executor", "MigratedOnFirstUse", "Migration", "Schema", "migrate", "open"]
