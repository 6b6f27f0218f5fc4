"""Dashboard sessions, kept in the auth store (SQLite or PostgreSQL): the browser holds only a random id in
a cookie (gateway/dashboard/access.py sets it); the store holds its SHA-256, so a copy of the database signs
nobody in. Sessions survive a gateway restart and every gateway sharing the store knows them.

A session names the key that signed in, never the key itself, so every page checks that key again in the
auth store: a revoked or expired key ends its sessions at once. Idle and absolute expiry are enforced on
read; `seen_at` is written at most once a minute per session, so a page view is not a write.

A visitor who has not signed in has no row: the cookie's id alone carries the CSRF token of the sign-in
form, an HMAC of the id keyed by the pepper every gateway shares (anonymous visitors cost no storage).
Sign-in replaces the id (no fixation).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable

import msgspec

from auth.models import SessionRecord
from auth.service import AuthService

IDLE_SECONDS = 3600.0
LIFETIME_SECONDS = 12 * 3600.0
TOUCH_SECONDS = 60.0  # how stale `seen_at` may get before a read writes it (idle expiry is this coarse)
_ID = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)


class Session(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    csrf: str
    key_id: str | None = None  # None until signed in
    is_admin: bool = False

    @property
    def signed_in(self) -> bool:
        return self.key_id is not None

    def csrf_matches(self, token: str | None) -> bool:
        return token is not None and token != "" and hmac.compare_digest(self.csrf, token)


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class SessionStore:
    def __init__(self, auth: AuthService, *, idle: float = IDLE_SECONDS, lifetime: float = LIFETIME_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self._auth, self._store = auth, auth.store
        self._idle, self._lifetime, self._clock = idle, lifetime, clock

    def _session(self, session_id: str, key_id: str | None = None, is_admin: bool = False) -> Session:
        return Session(id=session_id, csrf=self._auth.tag("dashboard-csrf", session_id), key_id=key_id,
                       is_admin=is_admin)

    def anonymous(self) -> Session:
        """A new visitor's session: nothing stored until it signs in."""
        return self._session(secrets.token_urlsafe(32))

    async def get(self, session_id: str | None) -> Session | None:
        """The cookie's session: signed in while its row lives and has not expired, else anonymous; None for a
        missing or malformed cookie."""
        if not session_id or not _ID.fullmatch(session_id):
            return None
        id_hash = _digest(session_id)
        row = await self._store.get_session(id_hash)
        if row is None:
            return self._session(session_id)
        now = self._clock()
        if now - row.seen_at > self._idle or now - row.created_at > self._lifetime:
            await self._store.delete_session(id_hash)
            return self._session(session_id)
        if now - row.seen_at > TOUCH_SECONDS:
            await self._store.touch_session(id_hash, now)
        return self._session(session_id, row.key_id, row.is_admin)

    async def start(self, *, key_id: str, is_admin: bool = False) -> Session:
        """A signed-in session under a new id; expired sessions are swept on the way."""
        now = self._clock()
        await self._store.delete_sessions_before(now - self._idle, now - self._lifetime)
        session = self._session(secrets.token_urlsafe(32), key_id, is_admin)
        await self._store.insert_session(SessionRecord(_digest(session.id), key_id, is_admin, now, now))
        return session

    async def end(self, session_id: str) -> None:
        await self._store.delete_session(_digest(session_id))

    async def end_key(self, key_id: str) -> None:
        """Every session the key signed in (it was revoked or expired)."""
        await self._store.delete_key_sessions(key_id)
