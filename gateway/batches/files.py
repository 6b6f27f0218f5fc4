"""Files of the OpenAI Files API, per team: uploads (`purpose: batch`) and what batches produce
(`batch_output`). Metadata rows in the database (schema.py). Bodies: with SQLite (one host) in
`<data dir>/batch_files/` (written to a temporary name, then renamed: a crash leaves no half file under a file's
name); with PostgreSQL in the database, in CHUNK-byte rows written in the transaction that adds the file's row,
since a fleet's gateways share the database but not a disk (any gateway may serve a file or finalize a batch).

Bounds: one upload is at most `max_file_bytes` (413) and a team keeps at most `team_max_file_bytes` of files
(400 `file_quota_exceeded`, checked in the inserting transaction); a file expires after `file_retention_s`
(gone for every read, purged by the runner's sweep). No upload is kept while the data dir's disk is under its
floor (twice the ledger's reserve plus the upload: 503 `file_storage_full`), so files never eat the space the
ledger keeps (SQLite; PostgreSQL's disk is its server's). Produced files are written whatever the quota: a
batch's results are never dropped."""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from pathlib import Path

import storage
from common.errors import BadRequest, PayloadTooLarge, SluiceError
from gateway.batches.schema import SCHEMA
from gateway.config import BatchSettings
from storage import Database

MAX_FILENAME_CHARS = 256
PURPOSES = ("batch", "batch_output")
CHUNK = 1 << 20


class FileQuotaExceeded(BadRequest):
    code = "file_quota_exceeded"


class FileStorageFull(SluiceError):
    status, type, code = 503, "service_unavailable", "file_storage_full"
    retry_after_s = 60.0


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


def file_object(row: tuple) -> dict:
    file_id, _, purpose, filename, size, created, expires = row
    return {"id": file_id, "object": "file", "bytes": size, "created_at": int(created), "filename": filename,
            "purpose": purpose, "status": "processed", "expires_at": int(expires) if expires else None,
            "status_details": None}


COLUMNS = "id, team_id, purpose, filename, bytes, created_at, expires_at"


class FileStore:
    def __init__(self, db: Database, root: Path, settings: BatchSettings, floor_bytes: int) -> None:
        self.db, self.root, self.settings, self.floor_bytes = db, root, settings, floor_bytes
        self.migrated = storage.MigratedOnFirstUse(db, SCHEMA)

    def path(self, file_id: str) -> Path:
        return self.root / f"{file_id}.jsonl"

    def _disk_has_room(self, size: int) -> bool:
        try:
            stat = os.statvfs(self.root)
        except OSError:
            return False
        return stat.f_bavail * stat.f_frsize - size >= self.floor_bytes

    async def create(self, team_id: str, purpose: str, filename: str, body: bytes, *,
                     produced: bool = False, file_id: str | None = None) -> dict:
        """Keep `body` as a new file of the team (raises PayloadTooLarge, FileQuotaExceeded, FileStorageFull)."""
        db = await self.migrated()
        if not produced and len(body) > self.settings.max_file_bytes:
            raise PayloadTooLarge(f"A file may hold at most {self.settings.max_file_bytes} bytes; this one holds "
                                  f"{len(body)}.", param="file")
        on_disk = db.dialect == "sqlite"
        if on_disk:
            self.root.mkdir(parents=True, exist_ok=True)
        if on_disk and not produced and not self._disk_has_room(len(body)):
            raise FileStorageFull("Files cannot be stored right now (storage is low); retry later.", param="file")
        file_id = file_id or new_file_id()
        now = time.time()
        if on_disk:
            temporary = self.root / f".{file_id}.{secrets.token_hex(4)}.part"
            await asyncio.to_thread(_write, temporary, self.path(file_id), body)
        try:
            async with db.transaction(lock=f"batch-file:{file_id}") as tx:  # an output file made once by any runner
                if await tx.fetchone("SELECT 1 FROM batch_files WHERE id = ?", (file_id,)) is not None:
                    row = await tx.fetchone(f"SELECT {COLUMNS} FROM batch_files WHERE id = ?", (file_id,))
                    assert row is not None  # found a line above, in this transaction
                    return file_object(row)  # a produced file written again (its batch finalized twice)
                if not produced:
                    summed = await tx.fetchone("SELECT COALESCE(SUM(bytes), 0) FROM batch_files WHERE team_id = ? "
                                               "AND expires_at > ?", (team_id, now))
                    assert summed is not None  # an aggregate without GROUP BY always returns one row
                    (used,) = summed
                    if int(used) + len(body) > self.settings.team_max_file_bytes:
                        raise FileQuotaExceeded(f"Your team keeps {int(used)} bytes of files; its quota is "
                                                f"{self.settings.team_max_file_bytes}. Delete files to make room.",
                                                param="file")
                row = (file_id, team_id, purpose, filename[:MAX_FILENAME_CHARS], len(body), now,
                       now + self.settings.file_retention_s)
                await tx.execute(f"INSERT INTO batch_files ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", row)
                if not on_disk:
                    await tx.executemany("INSERT INTO batch_file_bodies (file_id, seq, data) VALUES (?, ?, ?)",
                                         [(file_id, seq, body[start:start + CHUNK])
                                          for seq, start in enumerate(range(0, len(body), CHUNK))])
        except BaseException:
            if not produced and on_disk:
                self.path(file_id).unlink(missing_ok=True)
            raise
        return file_object(row)

    async def get(self, team_id: str, file_id: str) -> tuple | None:
        db = await self.migrated()
        return await db.fetchone(f"SELECT {COLUMNS} FROM batch_files WHERE id = ? AND team_id = ? AND expires_at > ?",
                                 (file_id, team_id, time.time()))

    async def list(self, team_id: str, purpose: str | None, after: str | None, limit: int,
                   ascending: bool) -> tuple[list[tuple], bool]:
        db = await self.migrated()
        sql = f"SELECT {COLUMNS} FROM batch_files WHERE team_id = ? AND expires_at > ?"
        args: list = [team_id, time.time()]
        if purpose is not None:
            sql, args = sql + " AND purpose = ?", [*args, purpose]
        if after is not None:
            anchor = await self.get(team_id, after)
            if anchor is not None:
                sign = ">" if ascending else "<"
                sql += f" AND (created_at {sign} ? OR (created_at = ? AND id {sign} ?))"
                args += [anchor[5], anchor[5], anchor[0]]
        order = "ASC" if ascending else "DESC"
        rows = await db.fetchall(f"{sql} ORDER BY created_at {order}, id {order} LIMIT ?", (*args, limit + 1))
        return rows[:limit], len(rows) > limit

    async def read(self, file_id: str) -> bytes:
        if self.db.dialect == "sqlite":
            return await asyncio.to_thread(self.path(file_id).read_bytes)
        rows = await self.db.fetchall("SELECT data FROM batch_file_bodies WHERE file_id = ? ORDER BY seq", (file_id,))
        return b"".join(bytes(data) for (data,) in rows)

    async def delete(self, team_id: str, file_id: str) -> bool:
        db = await self.migrated()
        async with db.transaction() as tx:
            if await tx.fetchone("SELECT 1 FROM batch_files WHERE id = ? AND team_id = ?", (file_id, team_id)) is None:
                return False
            await tx.execute("DELETE FROM batch_files WHERE id = ?", (file_id,))
            await self._drop_body(tx, file_id)
        return True

    async def _drop_body(self, tx, file_id: str) -> None:
        if self.db.dialect == "sqlite":
            self.path(file_id).unlink(missing_ok=True)
        else:
            await tx.execute("DELETE FROM batch_file_bodies WHERE file_id = ?", (file_id,))

    async def purge_expired(self) -> int:
        db = await self.migrated()
        rows = await db.fetchall("SELECT id FROM batch_files WHERE expires_at <= ?", (time.time(),))
        for (file_id,) in rows:
            async with db.transaction() as tx:
                await tx.execute("DELETE FROM batch_files WHERE id = ?", (file_id,))
                await self._drop_body(tx, file_id)
        return len(rows)


def _write(temporary: Path, final: Path, body: bytes) -> None:
    with open(temporary, "wb") as out:
        out.write(body)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, final)
