"""The headers every dashboard answer carries (pages, redirects, error pages, CSV downloads), set by one ASGI
middleware on the dashboard's router so no page can forget them:

- `Content-Security-Policy`: scripts and styles only from the dashboard's own files (no inline script, no
  inline event handler, no inline style, no eval), nothing loaded from elsewhere, forms posted only here,
  and no page framed by any site (`frame-ancestors 'none'`, with `X-Frame-Options: DENY` for old browsers).
- `Cache-Control: no-store`: a signed-in page (a new key shown in clear included) is never kept by the
  browser or a proxy, so Back after sign-out asks the gateway again and gets the sign-in page.
- `X-Content-Type-Options: nosniff` and `Referrer-Policy: same-origin`.
"""

from __future__ import annotations

from litestar.types import ASGIApp, Message, Receive, Scope, Send

CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                           "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
HEADERS = {
    b"content-security-policy": CONTENT_SECURITY_POLICY.encode(),
    b"x-frame-options": b"DENY",
    b"cache-control": b"no-store",
    b"x-content-type-options": b"nosniff",
    b"referrer-policy": b"same-origin",
}


def page_headers(app: ASGIApp) -> ASGIApp:
    """Every HTTP answer of `app` with HEADERS (replacing any value a handler set for the same names)."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(name, value) for name, value in message.get("headers", ()) if name.lower() not in HEADERS]
                message = {**message, "headers": [*kept, *HEADERS.items()]}
            await send(message)

        await app(scope, receive, send_with_headers)

    return middleware
