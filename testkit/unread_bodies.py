"""A request whose body never comes, for tests that prove an answer was decided before the body was read."""

from __future__ import annotations

import asyncio


async def answer_unread(url: str, key: str, path: str = "/v1/completions") -> tuple[int, bytes]:
    """POST `path` with a head that announces 1 MB of JSON and one byte of it sent, then nothing: (status, body) of
    the answer, which a server that waits for the body never gives (the read gives up after 30 s)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(f"POST {path} HTTP/1.1\r\nhost: sluice\r\ncontent-type: application/json\r\n"
                     f"authorization: Bearer {key}\r\ncontent-length: 1000000\r\n\r\n{{".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        length = int(next(line.split(b":")[1] for line in head.lower().split(b"\r\n")
                          if line.startswith(b"content-length:")))
        return int(head.split()[1]), await asyncio.wait_for(reader.readexactly(length), 30)
    finally:
        writer.close()
