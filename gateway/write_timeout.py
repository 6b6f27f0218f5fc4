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


def write_timeout_middleware(timeout: float):
    def middleware(app):
        async def guarded(scope, receive, send):
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            loop = asyncio.get_running_loop()
            stalled = asyncio.Event()
            body_read = False
            # one watchdog timer per response, not an asyncio.timeout per write (a stream writes once per token):
            # it checks the write in progress, if any, and re-arms for that write's own deadline
            writing_since: float | None = None
            writer: asyncio.Task | None = None
            watchdog: asyncio.TimerHandle | None = None
            overdue = False

            def check() -> None:
                nonlocal watchdog, overdue
                watchdog = None
                if writing_since is None:
                    return  # nothing waits: the next write arms it again
                left = writing_since + timeout - loop.time()
                if left > 0:
                    watchdog = loop.call_later(left, check)
                    return
                overdue = True
                writer.cancel()  # the write itself marks the client gone, as a timeout inside it would

            async def timed_send(message):
                nonlocal writing_since, writer, watchdog
                if stalled.is_set():  # the client counts as gone: nothing more is written
                    await asyncio.sleep(0)  # and the stream yields, so the disconnect's cancellation lands now
                    return
                if message["type"] != "http.response.body":
                    await send(message)
                    return
                writing_since, writer = loop.time(), asyncio.current_task(loop)
                if watchdog is None:
                    watchdog = loop.call_later(timeout, check)
                try:
                    await send(message)
                except asyncio.CancelledError:
                    if not (overdue and writer.uncancel() == 0):  # the watchdog's cancel alone is the stall
                        raise
                    stalled.set()
                    log.warning("client_write_timeout", path=scope["path"], timeout_s=timeout)
                finally:
                    writing_since = writer = None  # a finished task is not kept: its frames hold the stream

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
                if watchdog is not None:
                    watchdog.cancel()

        return guarded

    return middleware
