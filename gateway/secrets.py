"""The server pepper that keys API-key hashes: the `key_pepper` setting (SLUICE_KEY_PEPPER), else a file in the
data dir, made at the first start."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def pepper_path(data_dir: Path) -> Path:
    return data_dir / "key_pepper"


def load_pepper(data_dir: Path, configured: str = "") -> bytes:
    if configured:
        return configured.encode()
    path = pepper_path(data_dir)
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(secrets.token_bytes(32))
    return path.read_bytes()
