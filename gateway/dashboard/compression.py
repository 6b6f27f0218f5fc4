"""The dashboard's answers gzipped for browsers that accept it: its pages (the 90-day overview's HTML is mostly
tables and chart JSON, which compress tenfold), its CSS and its scripts. An ASGI middleware on the dashboard's
routers only: the API's streams (server-sent events) are never buffered. CSV downloads stream and are left alone.

BREACH (a page that reflects what an attacker put in its URL, compressed beside a secret) is answered where the
secret is: the CSRF token in every form is masked afresh for each page (access.masked_token), so no two answers
hold the same bytes for it; a new key's secret is only ever in the answer to a CSRF-checked POST."""

from __future__ import annotations

import gzip

from litestar.types import ASGIApp, Message, Receive, Scope, Send

COMPRESSIBLE = (b"text/html", b"text/css", b"text/javascript", b"application/javascript", b"application/json",
                b"image/svg+xml")
MIN_BYTES = 1024  # smaller answers are not worth a deflate stream's header and the CPU
LEVEL = 6


def _accepts_gzip(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"accept-encoding":
            return any(part.split(b";")[0].strip() == b"gzip" for part in value.lower().split(b","))
    return False


def _compressible(headers: list[tuple[bytes, bytes]]) -> bool:
    names = {name.lower(): value for name, value in headers}
    kind = names.get(b"content-type", b"").split(b";")[0].strip().lower()
    return kind in COMPRESSIBLE and b"content-encoding" not in names


def gzipped(app: ASGIApp) -> ASGIApp:
    """`app`'s compressible answers gzipped when the request accepts gzip (`Vary: Accept-Encoding` on all)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _accepts_gzip(scope):
            await app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []

        async def compressing(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                if not _compressible(list(message.get("headers", ()))):
                    await send(message)
                    return
                start = message  # held until the whole body is here
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = b"".join(chunks)
            headers = [(n, v) for n, v in start.get("headers", ()) if n.lower() not in (b"content-length", b"vary")]
            if len(body) >= MIN_BYTES:
                body = gzip.compress(body, LEVEL)
                headers.append((b"content-encoding", b"gzip"))
            headers += [(b"content-length", str(len(body)).encode()), (b"vary", b"Accept-Encoding")]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})

        await app(scope, receive, compressing)

    return middleware
