"""A model file's content hash, which names what the model cache derives from it (worker/gguf_load.py)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def remembered_sha256(path: Path, cache: Path) -> str:
    """`file_sha256`, remembered in `cache` under the file's path, size and mtime: hashing the default GGUF
    costs a cold start ~0.2 s each time. A file changed in place gets a new size or mtime, hence a new hash."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()
    memo = cache / ".sha256" / key
    with contextlib.suppress(OSError, UnicodeDecodeError):
        digest = memo.read_text().strip()
        if len(digest) == 64:
            return digest
    digest = file_sha256(path)
    with contextlib.suppress(OSError):  # a read-only cache only costs the hash again
        memo.parent.mkdir(parents=True, exist_ok=True)
        staging = memo.with_name(f".{key}.{os.getpid()}")
        staging.write_text(digest)
        os.replace(staging, memo)
    return digest
