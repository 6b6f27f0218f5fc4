"""The server pepper that keys API-key hashes: the `key_pepper` setting (SLUICE_KEY_PEPPER), else a file in the
data dir, made at the first start. `key_pepper` is the one place it is read from the settings: the server and the
operator commands (`sluice keys ...`) must hash a key alike, or a key one makes the other never finds."""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Protocol


class PepperSettings(Protocol):
    """What of gateway.config.Settings the pepper depends on (that layer is above this one)."""

    key_pepper: str

    @property
    def data_path(self) -> Path: ...


def key_pepper(settings: PepperSettings) -> bytes:
    """The pepper of a gateway with `settings`: the configured one, else the data dir's (made if missing)."""
    if settings.key_pepper:
        return settings.key_pepper.encode()
    path = settings.data_path / "key_pepper"
    if not path.exists():
        settings.data_path.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(secrets.token_bytes(32))
    return path.read_bytes()
