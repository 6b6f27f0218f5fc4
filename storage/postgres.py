"""The PostgreSQL driver: one asyncpg pool.

Queries are written in the one SQL of the stores (`?` / `?N` parameters: storage/sql_text.py), numbered here
($1, $2…) by `sql_text.postgres`. Transactions run at READ COMMITTED and take no lock of
their own; one opened with `lock=<name>` first takes the transaction-scoped advisory lock of that name, so the
writes that read before they write (migrations, bootstrap, a quota check, the fleet's state of one endpoint)
run one at a time across every process sharing the database, and nothing else waits for them (storage/README.md
lists who takes which). Reads outside a transaction are retried after a
connection the server ended (restart, failover, `pg_terminate_backend`).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar

import asyncpg

from storage.database import Dialect
from storage.errors import conflicts
from storage.sql_text import postgres

_T = TypeVar("_T")
POOL_SIZE = 8
_CONNECT_TIMEOUT = 10.0  # seconds: an unreachable server fails the start quickly instead of hanging
# What a connection ended by the server raises on its next use.
_RECONNECT_ERRORS = (asyncpg.ConnectionDoesNotExistError, asyncpg.InterfaceError, asyncpg.InternalClientError,
                     asyncpg.AdminShutdownError, asyncpg.PostgresConnectionError, ConnectionError)


def lock_id(name: str) -> int:
    """The advisory lock's number for `name`: a signed 64-bit hash, the same in every process."""
    return int.from_bytes(hashlib.sha256(f"sluice:{name}".encode()).digest()[:8], "big", signed=True)


class PostgresConnection:
    """The statements of one connection or of the pool (both have the same methods), integrity errors
    raised as `Conflict`."""

    def __init__(self, conn: asyncpg.Connection | asyncpg.Pool) -> None:
        self._conn = conn

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> None:
        with conflicts():
            await self._conn.execute(postgres(sql), *args)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        with conflicts():
            await self._conn.executemany(postgres(sql), [tuple(r) for r in rows])

    async def fetchone(self, sql: str, args: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        with conflicts():
            row = await self._conn.fetchrow(postgres(sql), *args)
        return tuple(row) if row is not None else None

    async def fetchall(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with conflicts():
            return [tuple(r) for r in await self._conn.fetch(postgres(sql), *args)]


class PostgresPool:
    dialect: Dialect = "postgres"

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self._exec = PostgresConnection(pool)

    @classmethod
    async def connect(cls, url: str) -> PostgresPool:
        return cls(await asyncpg.create_pool(url, min_size=1, max_size=POOL_SIZE, timeout=_CONNECT_TIMEOUT))

    async def execute(self, sql: str, args: Sequence[Any] = ()) -> None:
        await self._exec.execute(sql, args)  # a write is not retried: it may have been done

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        await self._exec.executemany(sql, rows)  # the pool runs it in a transaction of its own

    async def fetchone(self, sql: str, args: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return await self._retried(self._exec.fetchone, sql, args)

    async def fetchall(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await self._retried(self._exec.fetchall, sql, args)

    async def read(self, sql: str, args: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return await self._retried(self._exec.fetchall, sql, args)

    @staticmethod
    async def _retried(method: Callable[[str, Sequence[Any]], Awaitable[_T]], sql: str, args: Sequence[Any]) -> _T:
        # Every pooled connection may be dead at once; each failed try makes the pool replace one.
        for _ in range(POOL_SIZE):
            try:
                return await method(sql, args)
            except _RECONNECT_ERRORS:
                pass
        return await method(sql, args)

    @contextlib.asynccontextmanager
    async def transaction(self, lock: str | None = None) -> AsyncIterator[PostgresConnection]:
        async with self._pool.acquire() as conn, conn.transaction():
            if lock is not None:
                await conn.execute(postgres("SELECT pg_advisory_xact_lock(?)"), lock_id(lock))
            yield PostgresConnection(conn)

    async def close(self) -> None:
        await self._pool.close()
