"""The usage ledger: prices each record, makes it durable in the write-ahead log (group commit)
before `record()` returns, and ships it to the database in the background."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import msgspec
import structlog

from billing.bounds import bounded
from billing.insights.aggregate import usage_report
from billing.insights.requests import every_page
from billing.pricing import PricingTable
from billing.records import LedgerEntry, UsageRecord
from billing.shipper import Shipper
from billing.store import UsageStore, open_store
from billing.usage import UsageQuery, UsageReport
from billing.wal import Corrupt, WalWriter, frame, list_segments
from common.errors import LedgerUnavailable

log = structlog.get_logger(__name__)
SPACE_CHECK_INTERVAL = 0.25  # seconds between two looks at the log's free disk space


class Ledger:
    def __init__(self, store: UsageStore, writer: WalWriter, shipper: Shipper, pricing: PricingTable, *,
                 min_free_bytes: int = 0) -> None:
        self.store, self.pricing = store, pricing
        self._writer, self._shipper = writer, shipper
        self.min_free_bytes = min_free_bytes
        self._space_checked = -SPACE_CHECK_INTERVAL
        self._space_left = True
        self._encoder = msgspec.msgpack.Encoder()
        self._check = msgspec.msgpack.Decoder(LedgerEntry)

    @classmethod
    async def open(cls, database_url: str, wal_dir: Path, pricing: PricingTable, *,
                   max_segment_bytes: int = 8 << 20, min_free_bytes: int = 0) -> Ledger:
        """Connect, migrate, replay every WAL segment left by an earlier process (idempotent on
        request id), then start the writer and the shipper. `min_free_bytes`: the disk space kept for
        the records of requests already admitted (see `check_writable`)."""
        wal_dir = Path(wal_dir)
        wal_dir.mkdir(parents=True, exist_ok=True)
        store = await open_store(database_url)
        try:
            existing = list_segments(wal_dir)
            # a fresh segment for this process: never append after a possibly torn tail
            writer = WalWriter(wal_dir, (existing[-1] + 1) if existing else 1, max_segment_bytes)
            await writer.start()
            shipper = Shipper(wal_dir, writer, store, first_seq=existing[0] if existing else writer.seq)
            try:
                await shipper.drain()
            except Corrupt:
                pass  # logged and flagged by the shipper: the gateway starts, and refuses requests until it is fixed
            except BaseException:
                await writer.close()
                raise
        except BaseException:
            await store.close()
            raise
        if existing:
            log.info("billing.ledger.replayed", segments=len(existing), entries=shipper.shipped)
        shipper.start()
        return cls(store, writer, shipper, pricing, min_free_bytes=min_free_bytes)

    def check_writable(self) -> None:
        """Raise LedgerUnavailable while the log's disk has less than `min_free_bytes` free: a request
        admitted now might not be recordable when it ends. The space left is the reserve that the
        records of requests already admitted are written into; new requests are admitted again as soon
        as space returns. Also while the shipper is stopped at unreadable bytes in the log: what is
        recorded then cannot reach the database, and the log only grows."""
        if self._shipper.blocked is not None:
            raise LedgerUnavailable("the usage ledger cannot ship its log (an operator has been alerted); "
                                    "requests resume once it is repaired")
        now = time.monotonic()
        if now - self._space_checked >= SPACE_CHECK_INTERVAL:
            self._space_checked = now
            try:
                stat = os.statvfs(self._writer.wal_dir)
                left = stat.f_bavail * stat.f_frsize >= self.min_free_bytes
            except OSError:
                left = False
            if left != self._space_left:
                (log.info if left else log.error)("billing.ledger.disk_space", enough=left,
                                                  min_free_bytes=self.min_free_bytes)
            self._space_left = left
        if not self._space_left:
            raise LedgerUnavailable("the usage ledger's disk is full; requests resume once it has space again")

    async def record(self, rec: UsageRecord) -> None:
        """Returns once the priced record is on stable storage. Cancelling the caller does not
        withdraw the record. Raises ValueError for a malformed record, LedgerUnavailable when the log
        cannot be written. Strings longer than their bound (billing/bounds.py) are stored cut."""
        rec = bounded(rec)
        if rec.status == "rejected" and (rec.prompt_tokens or rec.completion_tokens or rec.compute_tokens
                                         or rec.cached_tokens or rec.accepted_prediction_tokens
                                         or rec.rejected_prediction_tokens):
            rec = msgspec.structs.replace(rec, prompt_tokens=0, completion_tokens=0, compute_tokens=0, cached_tokens=0,
                                          accepted_prediction_tokens=0, rejected_prediction_tokens=0)
        if rec.cached_tokens > rec.prompt_tokens >= 0:  # never more of the prompt cached than the prompt
            rec = msgspec.structs.replace(rec, cached_tokens=rec.prompt_tokens)
        rec = _prediction_within_completion(rec)
        price = self.pricing.price(rec.model, rec.time)
        # output is billed on every generated token (beams, best_of), as compute_tokens counts them
        charge = price.charge(rec.prompt_tokens, max(rec.compute_tokens, rec.completion_tokens),
                              cached_tokens=rec.cached_tokens, batch=rec.batch_id is not None)
        payload = self._encoder.encode(
            LedgerEntry(rec, price.input_micros, price.output_micros, charge.cost_micros, time.time(),
                        price.cached_micros, price.batch_discount_percent, charge.cache_saved_micros,
                        charge.batch_saved_micros))
        try:
            self._check.decode(payload)  # types and ranges, checked before the record can poison the log
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid usage record {rec.request_id!r}: {exc}") from None
        try:
            await asyncio.shield(self._writer.append(frame(payload)))
        except OSError as exc:  # the disk is full or failing: the record is not durable
            self._space_checked = -SPACE_CHECK_INTERVAL  # look at the disk again before admitting more
            raise LedgerUnavailable(f"the usage ledger cannot write its log ({exc.strerror or exc})") from exc

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until everything recorded so far is in the database (tests, shutdown, audits). Raises
        wal.Corrupt at once when unreadable bytes in the log stop the shipper: no wait would help."""
        async def ship() -> None:
            await self._writer.settle()
            backoff = 0.05
            while True:
                try:
                    await self._shipper.drain()
                    return
                except Corrupt:
                    raise
                except Exception:  # noqa: BLE001 - the database is away; keep trying until timeout
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
        await asyncio.wait_for(ship(), timeout)

    async def usage(self, query: UsageQuery) -> UsageReport:
        return await usage_report(self.store, query)

    async def records(self, query: UsageQuery) -> list[LedgerEntry]:
        """Every record of the query's view, oldest first, in one list (tests and audits of small
        windows; the API pages through `billing.insights.requests`)."""
        return [e async for entries in every_page(self.store, query.selection) for e in entries]

    @property
    def caught_up(self) -> bool:
        """Whether the database holds everything durable in the log."""
        return self._shipper.caught_up()

    async def close(self, timeout: float = 10.0) -> None:
        """Flush the log, ship what the database takes within `timeout` (the rest stays in the WAL
        for the next start), stop background tasks."""
        await self._writer.close()
        try:
            await self.flush(timeout)
        except (TimeoutError, Corrupt):
            log.warning("billing.ledger.close_unshipped", detail="left in the WAL for the next start")
        await self._shipper.stop()
        await self._shipper.retire_current()
        await self.store.close()


def _prediction_within_completion(rec: UsageRecord) -> UsageRecord:
    """Both prediction counts are part of completion_tokens: a record claiming more keeps its rejected tokens up to
    them (those are what the prediction added to the bill), then its accepted ones up to the rest."""
    rejected = min(rec.rejected_prediction_tokens, rec.completion_tokens)
    accepted = min(rec.accepted_prediction_tokens, rec.completion_tokens - rejected)
    if (accepted, rejected) == (rec.accepted_prediction_tokens, rec.rejected_prediction_tokens):
        return rec
    return msgspec.structs.replace(rec, accepted_prediction_tokens=accepted, rejected_prediction_tokens=rejected)
