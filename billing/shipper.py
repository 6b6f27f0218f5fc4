"""Moves write-ahead-log entries into the database, oldest first, and deletes a segment only after
the database confirmed every entry in it. Failures are retried forever with backoff; inserts are
idempotent on request id, so a batch confirmed but not acknowledged is simply shipped again.

Bytes the reader cannot read in the middle of a segment (`wal.Corrupt`) stop the shipper where they are:
nothing after them is skipped or deleted. It says so loudly (an error log line, the
`sluice_ledger_shipping_blocked` gauge, and `blocked`, which makes the ledger refuse new requests with 503)
and looks again every few seconds, so an operator who repairs or moves the segment aside
(docs/api.md, "What the usage ledger stores") resumes it without a restart."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import msgspec
import structlog

from billing.metrics import SHIPPING_BLOCKED
from billing.records import LedgerEntry
from billing.store.base import UsageStore
from billing.wal import Corrupt, WalWriter, list_segments, read_frames, segment_path

log = structlog.get_logger(__name__)


class Shipper:
    def __init__(self, wal_dir: Path, writer: WalWriter, store: UsageStore, *, first_seq: int,
                 batch_size: int = 2000, max_backoff: float = 5.0, linger: float = 1.0) -> None:
        self.wal_dir, self.writer, self.store = wal_dir, writer, store
        # gather records into bigger transactions; the WAL already made them safe. Each transaction is an fsync of
        # the database's own log on the disk the WAL's commits wait on: at 0.2 s, five a second under load, the
        # WAL's commit (which every answer waits for) stalled 24-144 ms in 2 of 5 bench runs, at 1 s in none of 4
        self.linger = linger
        self.batch_size, self.max_backoff = batch_size, max_backoff
        self.seq, self.offset = first_seq, 0  # cursor: everything before it is in the database
        self.shipped = 0  # entries the database confirmed in this process (new or already there)
        self.failures = 0
        self.blocked: Corrupt | None = None  # where shipping stopped at unreadable bytes, until they are gone
        self._decoder = msgspec.msgpack.Decoder(LedgerEntry)
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="billing-shipper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self.blocked is not None:  # no longer this process's to ship (the next start or sweep says so again)
            self.blocked = None
            SHIPPING_BLOCKED.dec()

    def caught_up(self) -> bool:
        return (self.seq, self.offset) >= (self.writer.seq, self.writer.durable_offset)

    async def drain(self) -> None:
        """Ship until the cursor reaches what was durable when it was called; raises on a database error.

        Not what became durable meanwhile: under load, chasing the writer shipped a few records per
        transaction, back to back, each an fsync of the database's log, and the WAL's own commits (which
        every answer waits for) queued behind them on the disk; those wait for the next linger."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            current, durable = self.writer.seq, self.writer.durable_offset
            while (self.seq, self.offset) < (current, durable):
                limit = durable if self.seq == current else None
                path = segment_path(self.wal_dir, self.seq)
                try:
                    payloads, end = await loop.run_in_executor(None, read_frames, path, self.offset, limit,
                                                               self.batch_size)
                except FileNotFoundError:  # a segment numbers skipped by a failed open (or one moved aside)
                    payloads, end = [], self.offset
                except Corrupt as corrupt:
                    self._block(corrupt)
                    raise
                self._unblock()
                if payloads:
                    entries = []
                    for payload in payloads:
                        try:
                            entries.append(self._decoder.decode(payload))
                        except msgspec.DecodeError as exc:  # CRC-valid but unreadable: keep going, loudly
                            log.error("billing.shipper.undecodable", segment=self.seq, error=str(exc))
                    if entries:
                        await self.store.insert(entries)
                    self.offset = end
                    self.shipped += len(entries)
                    continue
                if self.seq >= current:
                    return  # nothing whole to read before the mark
                # an older segment read to its end (read_frames raised had anything unreadable been left):
                # everything in it is in the database
                await loop.run_in_executor(None, _unlink, path)
                later = [s for s in list_segments(self.wal_dir) if s > self.seq]
                self.seq, self.offset = (later[0] if later else current), 0

    async def retire_current(self) -> None:
        """After the writer closed: delete its segment if the database holds all of it."""
        async with self._lock:
            if self.caught_up():
                await asyncio.get_running_loop().run_in_executor(
                    None, _unlink, segment_path(self.wal_dir, self.writer.seq))

    def _block(self, corrupt: Corrupt) -> None:
        if self.blocked is None or str(self.blocked) != str(corrupt):
            log.error("billing.shipper.corrupt_log", segment=corrupt.path.name, offset=corrupt.offset,
                      reason=corrupt.reason, detail="shipping stopped here; nothing after it is skipped or deleted")
        if self.blocked is None:
            SHIPPING_BLOCKED.inc()
        self.blocked = corrupt

    def _unblock(self) -> None:
        if self.blocked is not None:
            log.info("billing.shipper.unblocked", segment=self.blocked.path.name)
            self.blocked = None
            SHIPPING_BLOCKED.dec()

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancel that comes with a commit's
            # wake-up, and `stop` would wait for this loop forever
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self.writer.durable.wait()
            await asyncio.sleep(self.linger)
            self.writer.durable.clear()
            try:
                await self.drain()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except Corrupt:  # logged by _block; look again now and then, for a segment repaired or moved aside
                await asyncio.sleep(self.max_backoff)
                self.writer.durable.set()
            except Exception as exc:  # noqa: BLE001 - database down or flaky: keep the WAL, retry
                self.failures += 1
                log.warning("billing.shipper.retry", error=repr(exc), backoff_s=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff)
                self.writer.durable.set()  # try again without waiting for new records


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
