"""Dashboard sessions, kept on the server: the browser holds only a random id in an HttpOnly,
SameSite=Lax cookie (Secure behind https). A session names the key that signed in, never the key itself,
so every page checks that key again in the auth store: a revoked or expired key ends its sessions at once.

Every session, signed in or not, carries the CSRF token its forms echo back; sign-in replaces the id (no
fixation). Sessions live in the gateway process: a restart signs everyone out.
"""

from __future__ import annotations

import hmac
import secrets
import time

import msgspec

COOKIE = "sluice_session"
IDLE_SECONDS = 3600.0
LIFETIME_SECONDS = 12 * 3600.0
MAX_SESSIONS = 100_000  # bounds the memory anonymous visitors can take


class Session(msgspec.Struct, kw_only=True):
    id: str
    csrf: str
    created: float
    seen: float
    key_id: str | None = None  # None until signed in
    is_admin: bool = False

    @property
    def signed_in(self) -> bool:
        return self.key_id is not None

    def csrf_matches(self, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(self.csrf, token)


class SessionStore:
    def __init__(self, *, idle: float = IDLE_SECONDS, lifetime: float = LIFETIME_SECONDS,
                 capacity: int = MAX_SESSIONS) -> None:
        self._sessions: dict[str, Session] = {}
        self._idle, self._lifetime, self._capacity = idle, lifetime, capacity

    def get(self, session_id: str | None) -> Session | None:
        session = self._sessions.get(session_id) if session_id else None
        if session is None:
            return None
        now = time.time()
        if now - session.seen > self._idle or now - session.created > self._lifetime:
            self.end(session.id)
            return None
        session.seen = now
        return session

    def start(self, *, key_id: str | None = None, is_admin: bool = False) -> Session:
        if len(self._sessions) >= self._capacity:
            self._evict()
        now = time.time()
        session = Session(id=secrets.token_urlsafe(32), csrf=secrets.token_urlsafe(32), created=now, seen=now,
                          key_id=key_id, is_admin=is_admin)
        self._sessions[session.id] = session
        return session

    def end(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def end_key(self, key_id: str) -> None:
        """Every session the key signed in (it was revoked or expired)."""
        for session in [s for s in self._sessions.values() if s.key_id == key_id]:
            self.end(session.id)

    def _evict(self) -> None:
        now = time.time()
        for session in [s for s in self._sessions.values() if now - s.seen > self._idle]:
            self.end(session.id)
        if len(self._sessions) >= self._capacity:  # still full: drop the least recently seen tenth
            for session in sorted(self._sessions.values(), key=lambda s: s.seen)[:max(1, self._capacity // 10)]:
                self.end(session.id)
