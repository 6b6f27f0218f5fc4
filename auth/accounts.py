"""People signing in as themselves: e-mail and password, a one-time e-mail sign-in link, a password reset link.

- Passwords are scrypt hashes (auth/passwords.py). A wrong password and an unknown address get the same answer
  after the same work, and asking for a link always answers "sent if the account exists": nobody learns from
  the dashboard whether an address has an account.
- The throttle (`sign_in_failures`, shared by every gateway on the store): an account takes at most
  ACCOUNT_FAILURES failed passwords and a client address (its /64 for IPv6) CLIENT_FAILURES within WINDOW_S;
  past either, every attempt (a right password too: otherwise the throttle tells a guesser when it found one)
  is refused with 429 and the seconds to wait. A success clears the account's count. Links: at most
  MAIL_PER_ADDRESS e-mails to one address and MAIL_PER_CLIENT asked from one client within the window.
- Links are 256-bit random tokens, stored as their SHA-256, used once (one UPDATE ... RETURNING decides) and
  expiring: sign-in after LINK_TTL_S, reset after RESET_TTL_S. A password reset ends every session of the user.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from typing import TypeVar

from auth.clock import now
from auth.errors import AuthError, RequestError
from auth.forwarded import client_group
from auth.models import AccountRecord, LinkRecord
from auth.passwords import Hashing, HashingBusy, PasswordRefused, check_new, hash_password, verify
from auth.store import Store

WINDOW_S = 15 * 60.0
ACCOUNT_FAILURES = 5
CLIENT_FAILURES = 50
MAIL_PER_ADDRESS = 3
MAIL_PER_CLIENT = 20
LINK_TTL_S = 15 * 60.0
RESET_TTL_S = 30 * 60.0
MAX_EMAIL = 254
_EMAIL = re.compile(r"[^@\s<>,;\"'()\[\]\\]{1,64}@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+")
LINK_GONE = "This link has expired or was already used; ask for a new one."
WRONG = "That e-mail address and password do not match an account."
BUSY_RETRY_S = 5.0
T = TypeVar("T")


def normal_email(raw: object) -> str:
    """The address as accounts are keyed (trimmed, lower case); 400 `invalid_email` for anything else."""
    text = raw.strip().lower() if isinstance(raw, str) else ""
    if not text:
        raise RequestError(400, "invalid_email", "Enter an e-mail address.", "email")
    if len(text) > MAX_EMAIL or not _EMAIL.fullmatch(text):
        raise RequestError(400, "invalid_email", f"email must be an address like name@example.com, at most "
                           f"{MAX_EMAIL} characters.", "email")
    return text


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


def settable_password(password: object) -> str:
    """A password that may be set; 400 `weak_password` saying why not."""
    text = password if isinstance(password, str) else ""
    try:
        check_new(text)
    except PasswordRefused as exc:
        raise RequestError(400, "weak_password", str(exc), "password") from exc
    return text


async def hashed(hashing: Hashing, work: Callable[..., T], *args: object) -> T:
    """`work` (a hash or a check) run by `hashing`; 429 `too_many_sign_ins` while too many wait already."""
    try:
        return await hashing.run(work, *args)
    except HashingBusy:
        raise AuthError(429, "too_many_sign_ins", "Too many sign-ins at once; try again in a few seconds.",
                        BUSY_RETRY_S) from None


class Accounts:
    def __init__(self, store: Store, hashing: Hashing) -> None:
        self._store = store
        self._hashing = hashing

    async def _wait(self, limits: list[tuple[str, int]]) -> float | None:
        """Seconds until the first of `limits` ((subject, most in the window)) that is spent frees a slot."""
        at = now()
        for subject, most in limits:
            count, oldest = await self._store.failures_since(subject, at - WINDOW_S)
            if count >= most:
                return max(1.0, (oldest or at) + WINDOW_S - at)
        return None

    async def sign_in(self, email: str, password: str, client: str) -> str:
        """The user id of the account whose password this is; 401 (`WRONG`) or 429 with the seconds to wait."""
        limits = [(f"account:{email}", ACCOUNT_FAILURES), (f"client:{client_group(client)}", CLIENT_FAILURES)]
        wait = await self._wait(limits)
        if wait is not None:
            raise AuthError(429, "too_many_sign_ins", f"Too many failed sign-ins; try again in {int(wait // 60) + 1} "
                            "minutes, or ask for a sign-in link.", wait)
        account = await self._store.account_by_email(email)
        if not await hashed(self._hashing, verify, password, account.password_hash if account else None) \
                or account is None:
            at = now()
            await self._store.add_failure([subject for subject, _ in limits], at)
            await self._store.delete_failures_before(at - WINDOW_S)  # the table holds one window, no more
            raise AuthError(401, "wrong_password", WRONG)
        await self._store.clear_failures(limits[0][0])
        return account.user_id

    async def request_link(self, purpose: str, email: str, client: str) -> str | None:
        """A new sign-in or reset link's token for the account of `email`, None when there is no such account;
        429 when the address or the client asked too often (counted either way, so no one learns which)."""
        limits = [(f"mail:{email}", MAIL_PER_ADDRESS), (f"mail-client:{client_group(client)}", MAIL_PER_CLIENT)]
        wait = await self._wait(limits)
        if wait is not None:
            raise AuthError(429, "too_many_links", f"Too many links asked for; try again in {int(wait // 60) + 1} "
                            "minutes.", wait)
        at = now()
        await self._store.add_failure([subject for subject, _ in limits], at)
        await self._store.delete_failures_before(at - WINDOW_S)
        await self._store.delete_links_before(at)  # expired links are swept as new ones are made
        if await self._store.account_by_email(email) is None:
            return None
        token = new_token()
        ttl = LINK_TTL_S if purpose == "sign_in" else RESET_TTL_S
        await self._store.insert_link(token_hash(token), LinkRecord(purpose, email, None, None, email, at, at + ttl))
        return token

    async def peek(self, purpose: str, token: object) -> LinkRecord | None:
        if not isinstance(token, str) or len(token) > 100:
            return None
        return await self._store.peek_link(token_hash(token), purpose, now())

    async def use_sign_in_link(self, token: object) -> str:
        """The user id the sign-in link was sent to; 400 `link_expired` once used or expired."""
        link = await self._use("sign_in", token)
        account = await self._store.account_by_email(link.email)
        if account is None:
            raise RequestError(400, "link_expired", LINK_GONE)
        return account.user_id

    async def reset_password(self, token: object, password: object) -> str:
        """Sets the password the reset link was sent for and ends every session of its user (a reset is what
        someone does who thinks another knows the old one); the user id."""
        text = settable_password(password)  # refused before the link is used: a weak try keeps the link
        link = await self._use("reset", token)
        password_hash = await hashed(self._hashing, hash_password, text)  # hashed once the link proved good
        account = await self._store.account_by_email(link.email)
        if account is None:
            raise RequestError(400, "link_expired", LINK_GONE)
        await self._store.set_password_hash(account.user_id, password_hash)
        await self._store.delete_user_sessions(account.user_id)
        await self._store.clear_failures(f"account:{link.email}")
        return account.user_id

    async def _use(self, purpose: str, token: object) -> LinkRecord:
        link = None
        if isinstance(token, str) and len(token) <= 100:
            link = await self._store.use_link(token_hash(token), purpose, now())
        if link is None:
            raise RequestError(400, "link_expired", LINK_GONE)
        return link

    async def account_of(self, user_id: str) -> AccountRecord | None:
        return await self._store.account_of(user_id)
