"""The write timeout on its own, below the kernel's TCP_USER_TIMEOUT (which ends most stalled connections
first, tests/faults/test_slow_readers.py): a Litestar streaming route behind the middleware, driven by an ASGI
server whose socket stops accepting writes after the first chunk."""

from __future__ import annotations

import asyncio
import gc

from litestar import Litestar, get
from litestar.response import Stream

from gateway.edge.write_timeout import write_timeout_middleware


def streaming_app(closed: asyncio.Event) -> Litestar:
    @get("/stream")
    async def stream() -> Stream:
        async def chunks():
            try:
                for index in range(1000):
                    yield f"chunk {index}\n".encode()
                    await asyncio.sleep(0)
            finally:
                closed.set()  # what the gateway's generation stream does here: close the worker stream, record

        return Stream(chunks())

    return Litestar([stream], middleware=[write_timeout_middleware(0.2)])


SCOPE = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
         "path": "/stream", "raw_path": b"/stream", "query_string": b"", "headers": [], "client": ("t", 1),
         "server": ("t", 80), "root_path": ""}


async def serve(app: Litestar, write) -> list[bytes]:
    """Run one request the way uvicorn does: the body, then `http.disconnect` once the response is complete
    (or never, while it is not); every body write goes through `write`."""
    written: list[bytes] = []
    complete = asyncio.Event()
    requests = iter([{"type": "http.request", "body": b"", "more_body": False}])

    async def receive():
        message = next(requests, None)
        if message is None:
            await complete.wait()
            return {"type": "http.disconnect"}
        return message

    async def send(message):
        if message["type"] == "http.response.body":
            await write(written)
            written.append(message.get("body", b""))
            if not message.get("more_body", False):
                complete.set()

    await asyncio.wait_for(app({**SCOPE, "state": {}}, receive, send), timeout=30)
    return written


async def test_a_write_that_stalls_ends_the_stream_like_a_disconnect():
    closed = asyncio.Event()
    stuck = asyncio.Event()  # never set: the client stopped reading after the first chunk

    async def write(written: list[bytes]) -> None:
        if written:
            await stuck.wait()

    written = await serve(streaming_app(closed), write)
    assert closed.is_set()  # the stream generator was closed, not left suspended
    assert written == [b"chunk 0\n"]  # nothing was written after the stalled write


async def test_a_reader_that_keeps_up_is_never_cut():
    closed = asyncio.Event()

    async def write(written: list[bytes]) -> None:
        await asyncio.sleep(0.001)  # slow, but every write completes well within the timeout

    written = await serve(streaming_app(closed), write)
    assert len(written) == 1001 and written[-1] == b""  # every chunk, then the end of the body


async def test_a_response_leaves_no_reference_cycle_behind():
    """Its watchdog and timer must not hold each other: a cycle per request is garbage only the collector frees,
    and under load its collections were pauses of 5-20 ms."""
    async def answer(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        pass

    guarded = write_timeout_middleware(5.0)(answer)
    gc.collect()
    gc.disable()
    try:
        for _ in range(50):
            await guarded(dict(SCOPE), receive, send)
        assert gc.collect() == 0
    finally:
        gc.enable()
