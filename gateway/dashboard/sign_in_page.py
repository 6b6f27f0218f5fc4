"""The one sign-in page (login.html.j2): an account's e-mail and password, a one-time e-mail link, and an API key
(the operator's way in, and that of anyone who holds only a key); and where the reader was going before."""

from __future__ import annotations

import re

from litestar import Request
from litestar.response import Template

from auth.sessions import Session
from gateway.dashboard.access import BASE, cookie, masked_token

MAX_NEXT = 2000
NEXT = re.compile(r"/dashboard/[A-Za-z0-9._~%/?&=+:@,;!*'()-]*")  # a page of this dashboard, nothing else


def next_page_of(raw) -> str | None:
    """Where the reader was going before sign-in asked for a key: a path of this dashboard only (never another
    host, scheme or the sign-in and sign-out pages), bounded; None for anything else."""
    if not isinstance(raw, str) or len(raw) > MAX_NEXT or not NEXT.fullmatch(raw) or "//" in raw:
        return None
    path = raw.split("?", 1)[0]
    if "%" in path or {".", ".."} & set(path.split("/")):  # no dot segment, plain or encoded, leaves /dashboard/
        return None
    return None if raw.startswith((f"{BASE}/login", f"{BASE}/logout")) else raw


def login_page(request: Request, session: Session, message: str | None = None, status: int = 200,
               next_page: str | None = None, *, email: object = "", notice: bool = False) -> Template:
    """`notice`: the message is news (a link was sent), not a refusal."""
    services = getattr(request.app.state, "services", None)
    oidc = services.settings.oidc if services is not None else None
    return Template("login.html.j2", context={
        "csrf": masked_token(session), "message": message, "next": next_page, "notice": notice,
        "oidc_label": oidc.label if oidc is not None and oidc.issuer else None,
        "email": email if isinstance(email, str) else ""}, status_code=status, cookies=[cookie(request, session)])
