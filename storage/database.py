"""`Database`: a store's handle on the shared pool of one database URL, with one shape for SQLite and
PostgreSQL (storage/sqlite.py, storage/postgres.py).

Queries are written once, in the stores' one SQL (`?` / `?N` parameters, row locks as PostgreSQL spells them),
and translated per backend in one place (storage/sql_text.py). A write that a constraint refuses raises `Conflict`; a
database that cannot be reached raises `StoreUnavailable` (503) naming the store that asked, never a
driver error. Several stores hold handles on one pool (storage/registry.py); closing a handle releases
it, and the pool closes with the last one.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal, Protocol

from storage.errors import unavailable_when_down
from storage.sql_dialect import PostgresDialect, SqlDialect, SqliteDialect

Dialect = Literal["sqlite", "postgres"]
_SQL: dict[Dialect, SqlDialect] = {"sqlite": SqliteDialect(), "postgres": PostgresDialect()}


class Executor(Protocol):
    async def execute(self, sql: str, args: Sequence[Any] = ()) -> None: ...
    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None: ...
    async def fetchone(self, sql: str, args: Sequence[Any] = ()) -> tuple[Any, ...] | None: ...
    async def fetchall(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...


class Pool(Executor, Protocol):
    """What a driver provides (SqlitePool, PostgresPool); its errors are the driver's own."""

    dialect: Dialect

    def transaction(self, lock: str | None = None) -> contextlib.AbstractAsyncContextManager[Executor]: ...
    async def read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...
    async def close(self) -> None: ...


class _Translated:
    """An executor whose driver failures raise `StoreUnavailable` naming the store."""

    def __init__(self, executor: Executor, down: Callable[[], contextlib.AbstractContextManager[None]]) -> None:
        self._x = executor
        self._down = down

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> None:
        with self._down():
            await self._x.execute(sql, args)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with self._down():
            await self._x.executemany(sql, rows)

    async def fetchone(self, sql: str, args: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        with self._down():
            return await self._x.fetchone(sql, args)

    async def fetchall(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._down():
            return await self._x.fetchall(sql, args)


class Database(_Translated):
    """`store` and `code` name the store in the `StoreUnavailable` it raises ("the usage store (billing
    database) is unavailable", `usage_unavailable`). `release` runs once, at the first `close`."""

    def __init__(self, pool: Pool, store: str = "database", code: str = "store_unavailable", *,
                 release: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__(pool, functools.partial(unavailable_when_down, store, code))
        self.pool = pool
        self._release: Callable[[], Awaitable[None]] | None = release if release is not None else pool.close

    @property
    def dialect(self) -> Dialect:
        return self.pool.dialect

    @property
    def sql(self) -> SqlDialect:
        """The SQL functions this database spells its own way (storage/sql_dialect.py)."""
        return _SQL[self.dialect]

    @contextlib.asynccontextmanager
    async def transaction(self, *, lock: str | None = None) -> AsyncIterator[Executor]:
        """One transaction. A write that reads before it writes (a count against a quota, a row it may have to
        create) names a `lock`: on PostgreSQL the transactions of one lock name run one at a time across every
        process, and no others wait for them (every SQLite transaction is exclusive anyway). Writes that touch
        only their own rows (the ledger's inserts, a stored response's delete) name none."""
        with self._down():
            async with self.pool.transaction(lock) as tx:
                yield _Translated(tx, self._down)

    async def read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """The rows of one read-only statement, committed data only, run beside the writes (SQLite:
        on a read-only connection of their own)."""
        with self._down():
            return await self.pool.read(sql, args)

    async def close(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            await release()
