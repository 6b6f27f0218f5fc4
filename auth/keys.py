"""Key format and keyed hashing.

A key is `sk-sluice-<id>-<secret>`: `id` (12 hex chars) is public and indexes the row; `secret`
is 160 random bits in lowercase base32. Only HMAC-SHA256(pepper, key) is stored.
Operators may also register a free-form SLUICE_ADMIN_KEY (>= 32 chars); its id is derived
from a keyed hash of the value, so it is looked up the same way.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

PREFIX = "sk-sluice-"
MIN_CUSTOM_LENGTH = 32
_FORMAT = re.compile(r"sk-sluice-([0-9a-f]{12})-([a-z2-7]{32})")
_CUSTOM = re.compile(r"[\x21-\x7e]{32,256}")  # printable ASCII, no spaces


def new_key() -> tuple[str, str]:
    """A fresh (key_id, clear_key)."""
    key_id = secrets.token_hex(6)
    secret = base64.b32encode(secrets.token_bytes(20)).decode().lower()
    return key_id, f"{PREFIX}{key_id}-{secret}"


def display_prefix(key_id: str) -> str:
    return f"{PREFIX}{key_id}"


class KeyHasher:
    def __init__(self, pepper: bytes) -> None:
        if len(pepper) < 16:
            raise ValueError("the pepper must be at least 16 bytes")
        self._pepper = pepper

    def digest(self, clear_key: str) -> str:
        return hmac.new(self._pepper, clear_key.encode(), hashlib.sha256).hexdigest()

    def matches(self, clear_key: str, stored: str) -> bool:
        return hmac.compare_digest(self.digest(clear_key), stored)

    def key_id(self, clear_key: str) -> str | None:
        """The public id a presented key is looked up by, or None when it cannot be a key."""
        match = _FORMAT.fullmatch(clear_key)
        if match:
            return match.group(1)
        if _CUSTOM.fullmatch(clear_key) and not clear_key.startswith(PREFIX):
            return self.custom_id(clear_key)
        return None

    def tag(self, purpose: str, value: str) -> str:
        """A keyed tag of `value` for `purpose` (CSRF tokens); its message starts with NUL, which no key does."""
        return hmac.new(self._pepper, b"\0" + purpose.encode() + b"\0" + value.encode(), hashlib.sha256).hexdigest()

    def custom_id(self, clear_key: str) -> str:
        # Distinct message prefix, so the id never equals a prefix of the stored hash.
        mac = hmac.new(self._pepper, b"id:" + clear_key.encode(), hashlib.sha256).hexdigest()
        return "adm" + mac[:12]


def bearer_token(authorization: str | None) -> str | None:
    """The token of `Bearer <token>`, or None when the header is absent or malformed."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > 512:
        return None
    return token
