"""Thin async drivers with one shape for SQLite (aiosqlite) and PostgreSQL (asyncpg).

Queries are written once with `?` placeholders; the PostgreSQL driver numbers them ($1, $2…). A refused
write raises `Conflict`; a database that cannot be reached raises `StoreUnavailable` (503), never a driver
error.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sqlite3
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Protocol

import aiosqlite
import asyncpg

from common.errors import StoreUnavailable
from storage.errors import unavailable_when_down
from storage.sqlite_wal import connect_wal

_POOL_SIZE = 4
_CONNECT_TIMEOUT = 10.0  # seconds: an unreachable server fails the start quickly instead of hanging
_PG_LOCK_ID = 0x5A17_A0B1  # advisory lock serialising migrations and bootstrap across processes


class Conflict(Exception):
    """A unique or foreign-key constraint refused a write."""


def _unavailable():
    return unavailable_when_down("key store (auth database)", "auth_unavailable")


class Executor(Protocol):
    async def execute(self, sql: str, args: Sequence = ()) -> None: ...
    async def executemany(self, sql: str, rows: Iterable[Sequence]) -> None: ...
    async def fetchone(self, sql: str, args: Sequence = ()) -> tuple | None: ...
    async def fetchall(self, sql: str, args: Sequence = ()) -> list[tuple]: ...


class Database(Executor, Protocol):
    dialect: str

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Executor]: ...
    async def close(self) -> None: ...


# --- SQLite ---

class _SqliteExec:
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def execute(self, sql: str, args: Sequence = ()) -> None:
        try:
            with _unavailable():
                await self._conn.execute(sql, tuple(args))
        except sqlite3.IntegrityError as exc:
            raise Conflict(str(exc)) from exc

    async def executemany(self, sql: str, rows: Iterable[Sequence]) -> None:
        with _unavailable():
            await self._conn.executemany(sql, [tuple(r) for r in rows])

    async def fetchone(self, sql: str, args: Sequence = ()) -> tuple | None:
        try:
            with _unavailable():
                async with self._conn.execute(sql, tuple(args)) as cur:
                    row = await cur.fetchone()
        except sqlite3.IntegrityError as exc:
            raise Conflict(str(exc)) from exc
        return tuple(row) if row is not None else None

    async def fetchall(self, sql: str, args: Sequence = ()) -> list[tuple]:
        with _unavailable():
            async with self._conn.execute(sql, tuple(args)) as cur:
                return [tuple(r) for r in await cur.fetchall()]


class SqliteDatabase:
    """One connection in autocommit mode; a lock keeps other coroutines out of an open transaction."""

    dialect = "sqlite"

    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn
        self._exec = _SqliteExec(conn)
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, path: str) -> SqliteDatabase:
        with _unavailable():
            conn = await connect_wal(path)
            try:
                for pragma in ("foreign_keys=ON", "synchronous=NORMAL"):
                    await conn.execute(f"PRAGMA {pragma}")
            except BaseException:
                await conn.close()  # an unclosed connection's thread would keep the process from exiting
                raise
        return cls(conn)

    async def execute(self, sql: str, args: Sequence = ()) -> None:
        async with self._lock:
            await self._exec.execute(sql, args)

    async def executemany(self, sql: str, rows: Iterable[Sequence]) -> None:
        async with self.transaction() as tx:
            await tx.executemany(sql, rows)

    async def fetchone(self, sql: str, args: Sequence = ()) -> tuple | None:
        async with self._lock:
            return await self._exec.fetchone(sql, args)

    async def fetchall(self, sql: str, args: Sequence = ()) -> list[tuple]:
        async with self._lock:
            return await self._exec.fetchall(sql, args)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Executor]:
        async with self._lock:
            # IMMEDIATE takes the write lock up front, so concurrent processes queue instead of failing.
            with _unavailable():
                await self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._exec
            except BaseException:
                with _unavailable():
                    await self._conn.execute("ROLLBACK")
                raise
            with _unavailable():
                await self._conn.execute("COMMIT")

    async def close(self) -> None:
        await self._conn.close()


# --- PostgreSQL ---

@functools.lru_cache(maxsize=512)
def _numbered(sql: str) -> str:
    parts = sql.split("?")
    out = [parts[0]]
    for i, part in enumerate(parts[1:], start=1):
        out.append(f"${i}{part}")
    return "".join(out)


class _PgExec:
    def __init__(self, conn) -> None:  # an asyncpg Connection or Pool: both have the same methods
        self._conn = conn

    async def execute(self, sql: str, args: Sequence = ()) -> None:
        try:
            with _unavailable():
                await self._conn.execute(_numbered(sql), *args)
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise Conflict(str(exc)) from exc

    async def executemany(self, sql: str, rows: Iterable[Sequence]) -> None:
        with _unavailable():
            await self._conn.executemany(_numbered(sql), [tuple(r) for r in rows])

    async def fetchone(self, sql: str, args: Sequence = ()) -> tuple | None:
        try:
            with _unavailable():
                row = await self._conn.fetchrow(_numbered(sql), *args)
        except asyncpg.IntegrityConstraintViolationError as exc:
            raise Conflict(str(exc)) from exc
        return tuple(row) if row is not None else None

    async def fetchall(self, sql: str, args: Sequence = ()) -> list[tuple]:
        with _unavailable():
            return [tuple(r) for r in await self._conn.fetch(_numbered(sql), *args)]


# What a connection ended by the server (restart, failover, pg_terminate_backend) raises on next use.
_RECONNECT_ERRORS = (asyncpg.ConnectionDoesNotExistError, asyncpg.InterfaceError, asyncpg.InternalClientError,
                     asyncpg.AdminShutdownError, asyncpg.PostgresConnectionError, ConnectionError)


class PostgresDatabase(_PgExec):
    """A small pool; reads outside a transaction are retried once after a dropped connection."""

    dialect = "postgres"

    def __init__(self, pool: asyncpg.Pool) -> None:
        super().__init__(pool)
        self._pool = pool

    @classmethod
    async def connect(cls, url: str) -> PostgresDatabase:
        with _unavailable():
            return cls(await asyncpg.create_pool(url, min_size=1, max_size=_POOL_SIZE, timeout=_CONNECT_TIMEOUT))

    async def fetchone(self, sql: str, args: Sequence = ()) -> tuple | None:
        return await self._read(super().fetchone, sql, args)

    async def fetchall(self, sql: str, args: Sequence = ()) -> list[tuple]:
        return await self._read(super().fetchall, sql, args)

    @staticmethod
    async def _read(method, sql: str, args: Sequence):
        # Every pooled connection may be dead at once; each failed try makes the pool replace one.
        for _ in range(_POOL_SIZE):
            try:
                return await method(sql, args)
            except StoreUnavailable as exc:
                if not isinstance(exc.__cause__, _RECONNECT_ERRORS):
                    raise
        return await method(sql, args)

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Executor]:
        with _unavailable():  # the block's own errors are already translated by _PgExec
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", _PG_LOCK_ID)
                yield _PgExec(conn)

    async def close(self) -> None:
        await self._pool.close()


async def connect(url: str) -> Database:
    """`sqlite:///abs/path.db` or `postgresql://…` (also `postgres://…`)."""
    if url.startswith("sqlite://"):
        path = url[len("sqlite://"):]
        if not path:
            raise ValueError("sqlite URL needs a path: sqlite:///abs/path.db")
        return await SqliteDatabase.connect(path)
    if url.startswith(("postgresql://", "postgres://")):
        return await PostgresDatabase.connect(url)
    raise ValueError("database URL must start with sqlite:// or postgresql://")
