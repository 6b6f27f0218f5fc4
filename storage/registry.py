"""One pool per database URL: `open(url)` connects on the first call and hands every later caller a
handle on the same pool, so the auth, billing, endpoint and fleet stores of a gateway share one set
of connections. The pool closes once, when the last handle is closed (at shutdown).

Pools belong to the event loop that opened them (asyncpg's do), so the registry keeps one map per loop.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from pathlib import Path

from storage.database import Database, Pool
from storage.errors import unavailable_when_down
from storage.postgres import PostgresPool
from storage.sqlite import SqlitePool


class _Shared:
    """A pool being opened or open, and how many handles hold it."""

    def __init__(self, opening: asyncio.Future[Pool]) -> None:
        self.opening = opening
        self.handles = 0


_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Shared]] = weakref.WeakKeyDictionary()


def parse(url: str) -> tuple[str, str]:
    """(dialect, where): `sqlite:///abs/path.db` (or `sqlite:relative.db`) gives the file's absolute path;
    `postgresql://…` (or `postgres://…`) gives the URL. ValueError for anything else."""
    if url.startswith("sqlite:"):
        path = url[len("sqlite:"):].removeprefix("//")
        if not path:
            raise ValueError("sqlite URL needs a path: sqlite:///abs/path.db")
        return "sqlite", os.path.realpath(path)
    if url.startswith(("postgresql://", "postgres://")):
        return "postgres", url
    raise ValueError("database URL must start with sqlite:// or postgresql://")


async def connect(url: str) -> Pool:
    """A pool of its own, outside the registry (`open` shares the one it makes; tests call it to play
    several processes)."""
    dialect, where = parse(url)
    if dialect == "sqlite":
        return await SqlitePool.connect(Path(where))
    return await PostgresPool.connect(where)


async def open(url: str, *, store: str = "database", code: str = "store_unavailable") -> Database:
    """A handle on the shared pool of `url`; `store` and `code` name the caller in the `StoreUnavailable`
    that a failure raises (see `Database`). Close the handle when done: the last close closes the pool."""
    dialect, where = parse(url)
    key = f"{dialect}:{where}"
    by_url = _shared.setdefault(asyncio.get_running_loop(), {})
    shared = by_url.get(key)
    if shared is None:
        shared = by_url[key] = _Shared(asyncio.ensure_future(connect(url)))
    shared.handles += 1
    try:
        with unavailable_when_down(store, code):
            pool = await asyncio.shield(shared.opening)  # one caller cancelled does not cancel the others' open
    except BaseException:
        await _release(by_url, key, shared)
        raise
    return Database(pool, store, code, release=lambda: _release(by_url, key, shared))


async def _release(by_url: dict[str, _Shared], key: str, shared: _Shared) -> None:
    shared.handles -= 1
    if shared.handles > 0 and not _failed(shared.opening):
        return
    if by_url.get(key) is shared:
        del by_url[key]  # closing, or a failed open that the next caller must try again
    if shared.handles > 0:
        return
    if not shared.opening.done():  # the only opener gave up while connecting
        shared.opening.add_done_callback(_close_when_open)
    elif not _failed(shared.opening):
        await shared.opening.result().close()


def _failed(opening: asyncio.Future[Pool]) -> bool:
    return opening.done() and (opening.cancelled() or opening.exception() is not None)


_closing: set[asyncio.Task[None]] = set()  # references to the closes started by a callback, until they end


def _close_when_open(opening: asyncio.Future[Pool]) -> None:
    if not _failed(opening):
        task = asyncio.ensure_future(opening.result().close())
        _closing.add(task)
        task.add_done_callback(_closing.discard)
