"""Password hashes: scrypt (memory-hard, in the standard library), its parameters stored with each hash so
they can be raised later without locking anyone out.

N = 2**15, r = 8, p = 1 needs 32 MiB and about 0.1 s per hash: OWASP's recommended floor for scrypt. A guess
against a stolen table costs the same, on any hardware that has to hold the 32 MiB. Hashes are compared with
`hmac.compare_digest`; an unknown e-mail address is hashed against a dummy too, so the time of an answer does
not tell whether the account exists.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable
from typing import TypeVar

LOG2_N, R, P = 15, 8, 1
KEY_BYTES = 32
MIN_LENGTH, MAX_LENGTH = 10, 256  # a longer input is refused before any hashing (no hash-time denial of service)
_MAXMEM = 64 * 1024 * 1024
HASHES_AT_ONCE = 2  # each is ~0.1 s of one core and 32 MiB
HASHES_WAITING = 16  # beyond these a password request is refused at once, not queued
T = TypeVar("T")


class PasswordRefused(ValueError):
    """A new password that may not be set; the message says why."""


def check_new(password: str) -> None:
    if len(password) < MIN_LENGTH:
        raise PasswordRefused(f"A password has at least {MIN_LENGTH} characters.")
    if len(password) > MAX_LENGTH:
        raise PasswordRefused(f"A password has at most {MAX_LENGTH} characters.")
    if not password.strip():
        raise PasswordRefused("A password is more than spaces.")


def _scrypt(password: str, salt: bytes, log2_n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(password.encode(), salt=salt, n=1 << log2_n, r=r, p=p, maxmem=_MAXMEM, dklen=KEY_BYTES)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def hash_password(password: str) -> str:
    """`scrypt$<log2 N>$<r>$<p>$<salt>$<hash>`, salt and hash in base64."""
    salt = secrets.token_bytes(16)
    return f"scrypt${LOG2_N}${R}${P}${_b64(salt)}${_b64(_scrypt(password, salt, LOG2_N, R, P))}"


_DUMMY = hash_password(secrets.token_urlsafe(16))


def verify(password: str, stored: str | None) -> bool:
    """Whether `password` matches `stored` (None: no password set, or no account: the dummy is hashed anyway)."""
    if len(password) > MAX_LENGTH:
        return False
    try:
        _, log2_n, r, p, salt, expected = (stored or _DUMMY).split("$")
        computed = _scrypt(password, base64.b64decode(salt), int(log2_n), int(r), int(p))
    except (ValueError, MemoryError):
        return False
    return hmac.compare_digest(computed, base64.b64decode(expected)) and stored is not None


class HashingBusy(Exception):
    """More password hashes are waiting than HASHES_WAITING: the caller answers 429 and asks to try again."""


class Hashing:
    """Where password hashes are computed: off the event loop, HASHES_AT_ONCE at a time, at most HASHES_WAITING
    more queued. A hash costs ~0.1 s of CPU, so guesses sent in parallel from many addresses (each under its
    failure throttle) must not take the gateway's loop, its cores or its memory from everyone else."""

    def __init__(self) -> None:
        self._slots = asyncio.Semaphore(HASHES_AT_ONCE)
        self._waiting = 0

    async def run(self, work: Callable[..., T], *args: object) -> T:
        if self._waiting >= HASHES_WAITING:
            raise HashingBusy
        self._waiting += 1
        try:
            async with self._slots:
                return await asyncio.to_thread(work, *args)
        finally:
            self._waiting -= 1
