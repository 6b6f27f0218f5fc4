"""Stored responses (`store: true`, OpenAI's default): one row per response, in the gateway's database (the auth
store's), keyed by team. `GET` / `DELETE /v1/responses/{id}` and `previous_response_id` read only the caller's
team's rows: another team's id is as unknown as one that never existed.

A row holds the response object as answered and the conversation it continued (`messages`: the worker's chat
turns, its own output included), so `previous_response_id` replays the whole chain without walking it.
Its table has its own schema versions (package `responses`), applied on first use by each process.

Everything a tenant makes us keep here is bounded, counted against its team and expires (`StoragePolicy`, the
`[responses]` settings): one response is at most `max_response_bytes` (its object and conversation as JSON); a
team keeps at most `team_max_responses` of them and `team_max_bytes` in all; a response older than
`retention_s` is gone for every read and purged by the sweep (gateway/dialects/responses/sweep.py). The quota
is checked in the transaction that inserts, so concurrent creates cannot pass it together. On SQLite nothing
is stored while the database's disk has less than `disk_floor_bytes` free (`policy_of`: twice the ledger's reserve
and room for what SQLite adds at once), so stored responses never eat the space the usage ledger keeps for the
requests it admitted; on any database the fleet's stored responses together hold at most `max_total_bytes` (a
running total, `stored_responses_total`, moved in the transaction that inserts, deletes or purges: PostgreSQL's
row lock makes every gateway's creates pass it one at a time). Past either, a 503 `response_storage_full` refuses
`store: true` alone until deletes, the sweep or the operator make room."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import msgspec

import storage
from common.errors import BadRequest, SluiceError
from gateway.config import Settings
from storage import Database, Migration, Schema

INDEXES = [  # the sweep's, and a team's usage read from the index alone
    "CREATE INDEX IF NOT EXISTS stored_responses_created ON stored_responses (created_at)",
    "CREATE INDEX IF NOT EXISTS stored_responses_team_usage ON stored_responses (team_id, created_at, bytes)"]
SCHEMA = Schema("responses", [
    Migration(1, "stored responses", ["""CREATE TABLE IF NOT EXISTS stored_responses (
        team_id TEXT NOT NULL, id TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        response TEXT NOT NULL, messages TEXT NOT NULL, PRIMARY KEY (team_id, id))"""]),
    Migration(2, "stored bytes per response; expiry by age", {
        "sqlite": ["ALTER TABLE stored_responses ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0",
                   "UPDATE stored_responses SET bytes = length(CAST(response AS BLOB)) + "
                   "length(CAST(messages AS BLOB))",
                   *INDEXES],
        "postgres": ["ALTER TABLE stored_responses ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0",
                     "UPDATE stored_responses SET bytes = octet_length(response) + octet_length(messages)",
                     *INDEXES]}),
    Migration(3, "a running total of every team's stored bytes", [
        "CREATE TABLE IF NOT EXISTS stored_responses_total (id INTEGER PRIMARY KEY, bytes BIGINT NOT NULL)",
        "INSERT INTO stored_responses_total (id, bytes) SELECT 1, COALESCE(SUM(bytes), 0) FROM stored_responses"]),
], legacy_table="responses_schema_migrations")
# SQLite's default WAL auto-checkpoint (1000 pages of 4 KiB) moves this much into the database file at once
SQLITE_CHECKPOINT_BYTES = 4 << 20
STORAGE_FULL_RETRY_S = 60.0  # space comes back when an operator frees it or the sweep purges: not in a second


class ResponseTooLarge(BadRequest):
    code = "stored_response_too_large"


class StoredResponsesQuotaExceeded(BadRequest):
    """A team's stored responses are at its quota: a 400, not a 429 (waiting frees nothing; deleting or
    `store: false` does), so SDKs do not retry it."""

    code = "stored_responses_quota_exceeded"


class ResponseStorageFull(SluiceError):
    """The database's disk is down to the space kept for the ledger: `store: true` waits, nothing else does."""

    status, type, code = 503, "service_unavailable", "response_storage_full"
    retry_after_s = STORAGE_FULL_RETRY_S


def storage_full() -> ResponseStorageFull:
    return ResponseStorageFull("Responses cannot be stored right now (storage is low); retry later, or send "
                               "`store: false`.", param="store")


NOT_STORED = (ResponseTooLarge, StoredResponsesQuotaExceeded, ResponseStorageFull)  # what `save` refuses with


@dataclass(frozen=True)
class StoragePolicy:  # the `[responses]` settings (gateway/config.py) and the disk floor
    retention_s: float = 30 * 86_400.0
    max_response_bytes: int = 1 << 20
    team_max_bytes: int = 128 << 20
    team_max_responses: int = 10_000
    max_total_bytes: int = 16 << 30  # every team's together, fleet-wide
    disk_floor_bytes: int = 0  # free bytes the database's disk keeps (SQLite only); 0: none


def policy_of(settings: Settings) -> StoragePolicy:
    """The `[responses]` settings. The disk floor: twice the ledger's reserve (`ledger_min_free_bytes`), plus what
    SQLite may add to its file after the last look: one checkpoint of its WAL and two responses."""
    kept = settings.responses
    return StoragePolicy(retention_s=kept.retention_s, max_response_bytes=kept.max_response_bytes,
                         team_max_bytes=kept.team_max_bytes, team_max_responses=kept.team_max_responses,
                         max_total_bytes=kept.max_total_bytes,
                         disk_floor_bytes=2 * settings.ledger_min_free_bytes + SQLITE_CHECKPOINT_BYTES
                         + 2 * kept.max_response_bytes)


class StoredResponse(msgspec.Struct):
    response: dict
    messages: list[dict]


class ResponseStore:
    def __init__(self, db: Database, policy: StoragePolicy | None = None) -> None:
        self.db = db
        self.policy = policy or StoragePolicy()
        self._migrated = storage.MigratedOnFirstUse(db, SCHEMA)

    def _cutoff(self, now: float | None = None) -> float:
        """The oldest `created_at` still kept."""
        return (time.time() if now is None else now) - self.policy.retention_s

    async def admit(self, team_id: str, size: int, param: str) -> None:
        """Refuse before any work a response that could not be stored: `size` bytes before its output (over
        `max_response_bytes`: `param` named), a team at its quota, a disk down to its floor."""
        await self._check(await self._migrated(), team_id, size, param)

    async def _check(self, tx, team_id: str, size: int, param: str) -> None:
        policy = self.policy
        if size > policy.max_response_bytes:
            raise ResponseTooLarge(f"A stored response may hold at most {policy.max_response_bytes} bytes (its object "
                                   f"and the conversation it continues, as JSON); this one holds {size}. Send "
                                   "`store: false`, or start a new conversation.", param=param)
        count, used = await self._usage(tx, team_id)
        if count + 1 > policy.team_max_responses or used + size > policy.team_max_bytes:
            raise StoredResponsesQuotaExceeded(
                f"Your team stores {count} responses ({used} bytes); its quota is {policy.team_max_responses} "
                f"responses and {policy.team_max_bytes} bytes. Delete stored responses, or send `store: false`.",
                param="store")
        (total,) = await tx.fetchone("SELECT bytes FROM stored_responses_total WHERE id = 1")
        if total + size > policy.max_total_bytes or not await self._disk_has_room(tx):
            raise storage_full()

    async def _usage(self, tx, team_id: str) -> tuple[int, int]:
        row = await tx.fetchone("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM stored_responses "
                                "WHERE team_id = ? AND created_at >= ?", (team_id, self._cutoff()))
        return int(row[0]), int(row[1])

    async def _disk_has_room(self, tx) -> bool:
        """The database's disk (SQLite) has `disk_floor_bytes` free, counting the pages the file keeps free for
        reuse (deleted and purged responses leave them)."""
        path = getattr(self.db.pool, "path", None) if self.db.dialect == "sqlite" else None
        if path is None or self.policy.disk_floor_bytes <= 0:
            return True
        try:
            stat = os.statvfs(os.path.dirname(path))
        except OSError:
            return False
        free = stat.f_bavail * stat.f_frsize
        if free >= self.policy.disk_floor_bytes:
            return True
        (pages,), (page_bytes,) = await tx.fetchone("PRAGMA freelist_count"), await tx.fetchone("PRAGMA page_size")
        return free + pages * page_bytes >= self.policy.disk_floor_bytes

    async def save(self, team_id: str, response: dict, messages: list[dict]) -> None:
        """Store a finished response; raises ResponseTooLarge, StoredResponsesQuotaExceeded or
        ResponseStorageFull (nothing stored) when it does not fit."""
        db = await self._migrated()
        encoded_response = msgspec.json.encode(response).decode()
        encoded_messages = msgspec.json.encode(messages).decode()
        size = len(encoded_response.encode()) + len(encoded_messages.encode())
        async with db.transaction(lock=f"stored-responses:{team_id}") as tx:  # no other create of the team passes
            # the quota in between; other teams' creates do not wait
            await self._check(tx, team_id, size, "input")
            # the fleet's total, checked again under its row lock: another team's create may have just moved it
            if await tx.fetchone("UPDATE stored_responses_total SET bytes = bytes + ? WHERE id = 1 AND bytes + ? <= ? "
                                 "RETURNING bytes", (size, size, self.policy.max_total_bytes)) is None:
                raise storage_full()
            await tx.execute("INSERT INTO stored_responses (team_id, id, created_at, response, messages, bytes) "
                             "VALUES (?, ?, ?, ?, ?, ?)",
                             (team_id, response["id"], time.time(), encoded_response, encoded_messages, size))

    async def get(self, team_id: str, response_id: str) -> StoredResponse | None:
        db = await self._migrated()
        row = await db.fetchone("SELECT response, messages FROM stored_responses WHERE team_id = ? AND id = ? "
                                "AND created_at >= ?", (team_id, response_id, self._cutoff()))
        if row is None:
            return None
        return StoredResponse(msgspec.json.decode(row[0]), msgspec.json.decode(row[1]))

    async def delete(self, team_id: str, response_id: str) -> bool:
        db = await self._migrated()
        if await self.get(team_id, response_id) is None:
            return False
        async with db.transaction() as tx:
            await self._forget(tx, await tx.fetchall("DELETE FROM stored_responses WHERE team_id = ? AND id = ? "
                                                     "RETURNING bytes", (team_id, response_id)))
        return True

    @staticmethod
    async def _forget(tx, deleted: list[tuple]) -> None:
        """Take the `bytes` of rows just deleted (each returned once, whoever else deletes) off the total."""
        if deleted:
            await tx.execute("UPDATE stored_responses_total SET bytes = bytes - ? WHERE id = 1",
                             (sum(int(row[0]) for row in deleted),))

    async def total_bytes(self) -> int:
        """Every team's stored bytes, expired ones not yet purged included (they still hold the disk)."""
        (total,) = await (await self._migrated()).fetchone("SELECT bytes FROM stored_responses_total WHERE id = 1")
        return int(total)

    async def usage(self, team_id: str) -> tuple[int, int]:
        """(responses, bytes) a team keeps now, expired ones left out."""
        return await self._usage(await self._migrated(), team_id)

    async def purge_expired(self, now: float | None = None) -> int:
        """Delete every response past its retention; returns how many."""
        db = await self._migrated()
        cutoff = self._cutoff(now)
        async with db.transaction() as tx:
            deleted = await tx.fetchall("DELETE FROM stored_responses WHERE created_at < ? RETURNING bytes", (cutoff,))
            await self._forget(tx, deleted)
        return len(deleted)


_stores: dict[int, ResponseStore] = {}


def response_store(db: Database, policy: StoragePolicy | None = None) -> ResponseStore:
    """The one ResponseStore of a database (its migrations run once per process), under `policy` when given."""
    store = _stores.get(id(db))
    if store is None or store.db is not db:
        store = _stores[id(db)] = ResponseStore(db)
    if policy is not None:
        store.policy = policy
    return store
