"""Dashboard sessions, kept in the auth store (SQLite or PostgreSQL): the browser holds only a random id in
a cookie (gateway/dashboard/access.py sets it); the store holds its SHA-256, so a copy of the database signs
nobody in. Sessions survive a gateway restart and every gateway sharing the store knows them.

A session belongs to a user who signed in to their account (auth/accounts.py), or names the key that signed
in (the operator's way in), never the key itself, so every page checks that key again in the auth store: a
revoked or expired key ends its sessions at once. A user lists their own sessions (where and in what browser
each signed in) and ends any of them, or all at once ("sign out everywhere"); a password reset ends them all.
Idle and absolute expiry are enforced on read; `seen_at` is written at most once a minute per session, so a
page view is not a write.

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

from auth.models import MAX_AGENT, SessionRecord
from auth.service import AuthService

IDLE_SECONDS = 3600.0
LIFETIME_SECONDS = 12 * 3600.0
TOUCH_SECONDS = 60.0  # how stale `seen_at` may get before a read writes it (idle expiry is this coarse)
_ID = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)


ACCOUNT = "user:"  # an account session's signer id: the audit log's actor for what its user does


class Session(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    csrf: str
    key_id: str | None = None  # who signed in: a key's id, or ACCOUNT + the user id; None until signed in
    is_admin: bool = False
    user_id: str | None = None  # an account session's user (None: signed in with an API key)

    @property
    def signed_in(self) -> bool:
        return self.key_id is not None

    def csrf_matches(self, token: str | None) -> bool:
        return token is not None and token != "" and hmac.compare_digest(self.csrf, token)


def digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class SessionStore:
    def __init__(self, auth: AuthService, *, idle: float = IDLE_SECONDS, lifetime: float = LIFETIME_SECONDS,
                 clock: Callable[[], float] = time.time) -> None:
        self._auth, self._store = auth, auth.store
        self._idle, self._lifetime, self._clock = idle, lifetime, clock

    def _session(self, session_id: str, key_id: str | None = None, is_admin: bool = False,
                 user_id: str | None = None) -> Session:
        signer = f"{ACCOUNT}{user_id}" if user_id is not None else key_id
        return Session(id=session_id, csrf=self._auth.tag("dashboard-csrf", session_id), key_id=signer,
                       is_admin=is_admin, user_id=user_id)

    def anonymous(self) -> Session:
        """A new visitor's session: nothing stored until it signs in."""
        return self._session(secrets.token_urlsafe(32))

    async def get(self, session_id: str | None) -> Session | None:
        """The cookie's session: signed in while its row lives and has not expired, else anonymous; None for a
        missing or malformed cookie."""
        if not session_id or not _ID.fullmatch(session_id):
            return None
        id_hash = digest(session_id)
        row = await self._store.get_session(id_hash)
        if row is None:
            return self._session(session_id)
        now = self._clock()
        if now - row.seen_at > self._idle or now - row.created_at > self._lifetime:
            await self._store.delete_session(id_hash)
            return self._session(session_id)
        if now - row.seen_at > TOUCH_SECONDS:
            await self._store.touch_session(id_hash, now)
        return self._session(session_id, row.key_id, row.is_admin, row.user_id)

    async def start(self, *, key_id: str | None = None, is_admin: bool = False, user_id: str | None = None,
                    client: str = "", agent: str = "") -> Session:
        """A signed-in session of a key or (`user_id`) of an account, under a new id; expired sessions are swept
        on the way."""
        now = self._clock()
        await self._store.delete_sessions_before(now - self._idle, now - self._lifetime)
        session = self._session(secrets.token_urlsafe(32), None if user_id else key_id, is_admin, user_id)
        await self._store.insert_session(SessionRecord(
            digest(session.id), None if user_id else key_id, is_admin, now, now, user_id, client[:100],
            agent[:MAX_AGENT]))
        return session

    async def of_user(self, user_id: str) -> list[SessionRecord]:
        """The user's live sessions, newest first (`digest` tells which is the one asking)."""
        now = self._clock()
        return [row for row in await self._store.user_sessions(user_id)
                if now - row.seen_at <= self._idle and now - row.created_at <= self._lifetime]

    async def end_user_session(self, user_id: str, id_hash: str) -> bool:
        """One of the user's own sessions; False when `id_hash` is none of theirs."""
        return await self._store.delete_user_session(user_id, id_hash)

    async def end_user(self, user_id: str) -> None:
        """Sign out everywhere."""
        await self._store.delete_user_sessions(user_id)

    async def end(self, session_id: str) -> None:
        await self._store.delete_session(digest(session_id))

    async def end_key(self, key_id: str) -> None:
        """Every session the key signed in (it was revoked or expired)."""
        await self._store.delete_key_sessions(key_id)
