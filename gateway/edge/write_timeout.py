"""Clients that read slowly or not at all: a stream's write that cannot complete within
`stream_write_timeout_s` ends that stream as if the client had left.

Each stream's buffering is already bounded: uvicorn's transport holds at most about 64 KiB before
`send` waits, and the stream generator holds one chunk. What was missing is an end to the wait: a stalled
client would hold its worker row, its concurrency slot and its connection forever. Here a body write that
waits longer than the timeout marks the client gone: later writes are dropped, and the app's disconnect
listener hears `http.disconnect`, which cancels the stream the same way a real disconnect does (the
request is recorded as cancelled, the worker stream is closed). The socket itself is then cut by the
kernel: `cli.listen` sets TCP_USER_TIMEOUT to the same value, so a connection whose unread data cannot
be delivered for that long is aborted, and its buffers are freed.
"""

from __future__ import annotations

import asyncio

import structlog

log = structlog.get_logger("gateway")
DISCONNECT = {"type": "http.disconnect"}


class _Watchdog:
    """One timer per response, not an asyncio.timeout per write (a stream writes once per token): when it fires it
    checks the write in progress, if any, and re-arms for that write's own deadline. A class, not a closure that
    re-arms itself: such a closure and its timer hold each other, a cycle per request that only the garbage
    collector could free (its collections were pauses of 5-20 ms under load)."""

    __slots__ = ("_loop", "_timeout", "_since", "_writer", "_timer", "overdue")

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._loop, self._timeout = loop, timeout
        self._since: float | None = None  # when the write in progress began
        self._writer: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.overdue = False

    def writing(self, writer: asyncio.Task) -> None:
        self._since, self._writer = self._loop.time(), writer
        if self._timer is None:
            self._timer = self._loop.call_later(self._timeout, self._check)

    def written(self) -> None:
        self._since = self._writer = None  # a finished task is not kept: its frames hold the stream

    def _check(self) -> None:
        self._timer = None
        if self._since is None:
            return  # nothing waits: the next write arms it again
        left = self._since + self._timeout - self._loop.time()
        if left > 0:
            self._timer = self._loop.call_later(left, self._check)
            return
        self.overdue = True
        self._writer.cancel()  # the write itself marks the client gone, as a timeout inside it would

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def write_timeout_middleware(timeout: float):
    def middleware(app):
        async def guarded(scope, receive, send):
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            loop = asyncio.get_running_loop()
            stalled = asyncio.Event()
            body_read = False
            watchdog = _Watchdog(loop, timeout)

            async def timed_send(message):
                if stalled.is_set():  # the client counts as gone: nothing more is written
                    await asyncio.sleep(0)  # and the stream yields, so the disconnect's cancellation lands now
                    return
                if message["type"] != "http.response.body":
                    await send(message)
                    return
                writer = asyncio.current_task(loop)
                watchdog.writing(writer)
                try:
                    await send(message)
                except asyncio.CancelledError:
                    if not (watchdog.overdue and writer.uncancel() == 0):  # the watchdog's cancel alone is the stall
                        raise
                    stalled.set()
                    log.warning("client_write_timeout", path=scope["path"], timeout_s=timeout)
                finally:
                    watchdog.written()

            async def watched_receive():
                nonlocal body_read
                if stalled.is_set():
                    return DISCONNECT
                if not body_read:  # the body itself is read as usual
                    message = await receive()
                    body_read = message["type"] != "http.request" or not message.get("more_body", False)
                    return message
                # after the body only a disconnect can come (the app's listener waits for it): a stall counts
                waiting = {asyncio.ensure_future(receive()), asyncio.ensure_future(stalled.wait())}
                try:
                    done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in waiting:
                        task.cancel()
                first = done.pop()
                return DISCONNECT if first.result() is True else first.result()

            try:
                await app(scope, watched_receive, timed_send)
            finally:
                watchdog.close()

        return guarded

    return middleware
