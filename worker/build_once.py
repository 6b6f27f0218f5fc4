"""A cache directory built once and shared by processes (dequantized GGUF models, S3 downloads).

Workers that start together (two replicas of an endpoint, or the test processes of a fresh checkout)
would otherwise build the same directory at once: the second rename fails on the first one's directory,
or a reader sees the marker file of a copy whose other files are still landing. Here one process builds,
under an exclusive lock, into a staging directory that is renamed into place only when complete; the
others wait on the lock and find the directory done.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    with lock.open("a") as handle:  # flock: released when the process ends, however it ends
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build_once(target: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """`target`, built by `build(staging)` unless `target/marker` shows a complete copy is there."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with exclusive(target.with_name(f".{target.name}.lock")):
        if (target / marker).exists():  # another process built it while this one waited
            return target
        for leftover in target.parent.glob(f".{target.name}.staging-*"):  # a builder killed mid-way
            shutil.rmtree(leftover, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.staging-"))
        try:
            build(staging)
            if target.exists():  # a copy without its marker: an older layout, or someone's partial copy
                shutil.rmtree(target)
            os.replace(staging, target)  # atomic: nobody ever sees a half-built directory
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return target
