"""A wait for a replica that ends when the client disconnects: a request that waits in an endpoint's queue (a
generation, a tokenizer call) gives up its place the moment its client leaves, not when a replica would have come
or the wait ran out.

Only a wait is watched: the request's body was read before it, so a disconnect is all the connection can still
say, and no response has begun, so nothing else is listening for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from litestar import Request

from gateway.errors import SluiceError

T = TypeVar("T")
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before the answer; nobody reads it


class ClientGone(SluiceError):
    """The client disconnected while its request waited for a replica (answered 499, to nobody)."""

    status, type, code = CLIENT_CLOSED_REQUEST, "client_closed_request", "client_closed_request"

    def __init__(self) -> None:
        super().__init__("the client disconnected while the request waited for a replica")


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """`work` (a wait for a replica), cancelled when the client disconnects first (ClientGone). What the wait
    ended with, if it ended as the client left."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
    if task.cancelled():
        raise ClientGone
    return task.result()


async def _disconnected(request: Request) -> None:
    """Returns when the client disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
