"""Where this gateway keeps its usage write-ahead log, and the replay of logs that dead gateways left.

Alone (the default) the log is `<data_dir>/billing-wal` and a restart on the same disk replays it.
On a volume shared by several gateways (`wal_root`: an EFS mount on ECS, where a task's own disk
dies with the task) each process writes under `<wal_root>/<instance>/` while it holds an exclusive
lock on `<wal_root>/<instance>.lock`. A directory whose lock nobody holds belongs to a process that
is gone (the kernel, or the NFS server once its lease lapses, drops a dead holder's lock): a live
gateway adopts it, ships every entry to the database (idempotent on request id), then deletes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import shutil
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

import structlog

from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.wal import list_segments
from common.periodic import Periodic

log = structlog.get_logger(__name__)
_LOCK = ".lock"


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive lock on `path`, or None when another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


@dataclass
class WalHome:
    path: Path  # this process's WAL directory
    root: Path | None = None  # the shared volume, when there is one
    _lock_fd: int | None = None

    @classmethod
    def claim(cls, data_dir: Path, wal_root: str) -> WalHome:
        if not wal_root:
            return cls(data_dir / "billing-wal")
        root = Path(wal_root)
        root.mkdir(parents=True, exist_ok=True)
        name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        fd = _try_lock(root / f"{name}{_LOCK}")
        if fd is None:  # a random name nobody else uses: only a broken file system gets here
            raise OSError(errno.ENOLCK, "a fresh WAL directory cannot be locked", str(root))
        return cls(root / name, root, fd)

    def release(self) -> None:
        """After the ledger closed: a log the database holds entirely leaves nothing behind."""
        if self._lock_fd is None or self.root is None:
            return
        _remove_if_shipped(self.path)
        _unlock(self._lock_fd)
        self._lock_fd = None


def _remove_if_shipped(directory: Path) -> bool:
    """Delete a WAL directory whose segments are all shipped (the ledger deletes those), with its lock file."""
    if directory.exists() and list_segments(directory):
        return False
    shutil.rmtree(directory, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(directory.parent / f"{directory.name}{_LOCK}")
    return True


async def adopt_orphans(home: WalHome, database_url: str, pricing: PricingTable) -> list[str]:
    """Replay into the database every WAL directory under the shared root whose owner is gone;
    returns the names of the directories adopted and removed."""
    if home.root is None:
        return []
    adopted = []
    for lock_path in sorted(home.root.glob(f"*{_LOCK}")):
        name = lock_path.name[:-len(_LOCK)]
        if name == home.path.name:
            continue
        fd = await asyncio.to_thread(_try_lock, lock_path)
        if fd is None:
            continue  # its gateway is alive
        try:
            directory = home.root / name
            if directory.exists():
                ledger = await Ledger.open(database_url, directory, pricing)  # replays every segment
                await ledger.close()
            if await asyncio.to_thread(_remove_if_shipped, directory):
                adopted.append(name)
                log.info("billing.wal.adopted", directory=name)
        except Exception as exc:  # noqa: BLE001 - the database is away: the log stays for the next sweep
            log.warning("billing.wal.adopt_failed", directory=name, error=repr(exc))
        finally:
            _unlock(fd)
    return adopted


def orphan_sweeper(home: WalHome, database_url: str, pricing: PricingTable, interval: float = 30.0) -> Periodic | None:
    """Adopts dead gateways' logs at start-up and then every `interval` seconds; None without a shared WAL root."""
    if home.root is None:
        return None
    return Periodic("billing-wal-sweeper", interval, lambda: adopt_orphans(home, database_url, pricing))
