"""Files of the OpenAI Files API, per team: uploads (`purpose: batch`) and what batches produce
(`batch_output`). Metadata rows in the database (schema.py); bodies where bodies.py keeps them (the data dir,
the database, or S3), written and read in chunks.

An upload streams in (`begin_upload`, upload.py feeds it): it is a `batch_file_uploads` row while it runs, which
bounds a team's uploads in progress across a fleet (`team_max_concurrent_uploads`, 429 `too_many_uploads`; one
process takes `max_concurrent_uploads` of every team at once, bounding what their buffers hold), and
becomes a file only when its `batch_files` row is written, after its body is whole: a gateway killed mid-upload
leaves no file, and its body is dropped once the upload is `upload_timeout_s` old (`purge_expired`).

Bounds: one upload is at most `max_file_bytes` (413), `max_file_lines` lines (400 `too_many_lines`) of at most
`max_line_bytes` each (400 `line_too_large`), checked as bytes arrive; a team keeps at most `team_max_file_bytes`
of files (400 `file_quota_exceeded`: as bytes arrive, then again in the inserting transaction); a file expires
after `file_retention_s` (gone for every read, purged by the runner's sweep). No upload is kept while the data
dir's disk is under its floor (twice the ledger's reserve plus the upload: 503 `file_storage_full`), so files
never eat the space the ledger keeps (bodies on disk only). Produced files are written whatever the quota: a
batch's results are never dropped."""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import AsyncIterator

import storage
from common.errors import BadRequest, PayloadTooLarge, SluiceError
from gateway.batches.bodies import CHUNK, Bodies, BodyWriter, DiskBodies
from gateway.batches.schema import SCHEMA
from gateway.config import BatchSettings
from storage import Database

MAX_FILENAME_CHARS = 256
PURPOSES = ("batch", "batch_output")


class FileQuotaExceeded(BadRequest):
    code = "file_quota_exceeded"


class TooManyLines(BadRequest):
    code = "too_many_lines"


class LineTooLarge(BadRequest):
    code = "line_too_large"


class TooManyUploads(SluiceError):
    status, type, code = 429, "rate_limit_exceeded", "too_many_uploads"
    retry_after_s = 5.0


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
    def __init__(self, db: Database, bodies: Bodies, settings: BatchSettings, floor_bytes: int) -> None:
        self.db, self.bodies, self.settings, self.floor_bytes = db, bodies, settings, floor_bytes
        self.migrated = storage.MigratedOnFirstUse(db, SCHEMA)
        self.open_uploads = 0  # this process's, every team's

    def _disk_has_room(self, size: int) -> bool:
        if not isinstance(self.bodies, DiskBodies):
            return True  # the database's or the bucket's disk: not this host's
        try:
            stat = os.statvfs(self.bodies.root)
        except OSError:
            return False
        return stat.f_bavail * stat.f_frsize - size >= self.floor_bytes

    def _check_room(self, size: int) -> None:
        if not self._disk_has_room(size):
            raise FileStorageFull("Files cannot be stored right now (storage is low); retry later.", param="file")

    async def _used(self, tx, team_id: str, now: float) -> int:
        summed = await tx.fetchone("SELECT COALESCE(SUM(bytes), 0) FROM batch_files WHERE team_id = ? "
                                   "AND expires_at > ?", (team_id, now))
        assert summed is not None  # an aggregate without GROUP BY always returns one row
        return int(summed[0])

    def _over_quota(self, used: int, size: int) -> FileQuotaExceeded | None:
        if used + size <= self.settings.team_max_file_bytes:
            return None
        return FileQuotaExceeded(f"Your team keeps {used} bytes of files; its quota is "
                                 f"{self.settings.team_max_file_bytes}. Delete files to make room.", param="file")

    async def begin_upload(self, team_id: str) -> Upload:
        """An upload of the team, counted among its uploads in progress until it is committed or aborted."""
        db = await self.migrated()
        if isinstance(self.bodies, DiskBodies):
            self.bodies.root.mkdir(parents=True, exist_ok=True)
        self._check_room(0)
        if self.open_uploads >= self.settings.max_concurrent_uploads:
            raise TooManyUploads(f"This gateway takes in {self.open_uploads} uploads at once, as many as it may "
                                 "(max_concurrent_uploads); retry shortly.")
        now, file_id = time.time(), new_file_id()
        async with db.transaction(lock=f"batch-uploads:{team_id}") as tx:
            row = await tx.fetchone("SELECT COUNT(*) FROM batch_file_uploads WHERE team_id = ? AND started_at > ?",
                                    (team_id, now - self.settings.upload_timeout_s))
            assert row is not None  # an aggregate without GROUP BY always returns one row
            if int(row[0]) >= self.settings.team_max_concurrent_uploads:
                raise TooManyUploads(f"Your team has {int(row[0])} uploads in progress, as many as it may "
                                     f"(team_max_concurrent_uploads); retry once one ends.")
            used = await self._used(tx, team_id, now)
            if (refused := self._over_quota(used, 0)) is not None:
                raise refused
            await tx.execute("INSERT INTO batch_file_uploads (file_id, team_id, started_at) VALUES (?, ?, ?)",
                             (file_id, team_id, now))
        self.open_uploads += 1
        try:
            return Upload(self, team_id, file_id, used, self.bodies.writer(file_id))
        except BaseException:
            self.open_uploads -= 1
            await db.execute("DELETE FROM batch_file_uploads WHERE file_id = ?", (file_id,))
            raise

    async def create(self, team_id: str, purpose: str, filename: str, body: bytes, *,
                     produced: bool = False, file_id: str | None = None) -> dict:
        """Keep `body` (in memory already) as a new file of the team; a produced file (`batch_output`) under an id
        derived from its batch is written once whoever finalizes it (raises PayloadTooLarge, FileQuotaExceeded,
        FileStorageFull)."""
        if not produced:
            upload = await self.begin_upload(team_id)
            async with upload:
                for start in range(0, len(body), CHUNK):
                    await upload.write(body[start:start + CHUNK])
                return await upload.commit(filename, purpose)
        db = await self.migrated()
        file_id = file_id or new_file_id()
        now = time.time()
        async with db.transaction(lock=f"batch-file:{file_id}") as tx:  # an output file made once by any runner
            found = await tx.fetchone(f"SELECT {COLUMNS} FROM batch_files WHERE id = ?", (file_id,))
            if found is not None:
                return file_object(found)  # a produced file written again (its batch finalized twice)
            await self.bodies.put(tx, file_id, body)
            row = (file_id, team_id, purpose, filename[:MAX_FILENAME_CHARS], len(body), now,
                   now + self.settings.file_retention_s)
            await tx.execute(f"INSERT INTO batch_files ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", row)
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

    def chunks(self, file_id: str) -> AsyncIterator[bytes]:
        """A file's body, CHUNK bytes at a time (the caller checked the file is its team's: `get`)."""
        return self.bodies.chunks(file_id)

    async def delete(self, team_id: str, file_id: str) -> bool:
        db = await self.migrated()
        async with db.transaction() as tx:
            if await tx.fetchone("SELECT 1 FROM batch_files WHERE id = ? AND team_id = ?", (file_id, team_id)) is None:
                return False
            await tx.execute("DELETE FROM batch_files WHERE id = ?", (file_id,))
            await self.bodies.drop(tx, file_id)
        return True

    async def purge_expired(self) -> int:
        """Drop expired files, and the bodies of uploads cut short (their gateway died) once they are too old to
        be running still."""
        db = await self.migrated()
        now = time.time()
        rows = await db.fetchall("SELECT id FROM batch_files WHERE expires_at <= ?", (now,))
        for (file_id,) in rows:
            async with db.transaction() as tx:
                await tx.execute("DELETE FROM batch_files WHERE id = ?", (file_id,))
                await self.bodies.drop(tx, file_id)
        stale = await db.fetchall("SELECT file_id FROM batch_file_uploads WHERE started_at <= ?",
                                  (now - self.settings.upload_timeout_s - STALE_SLACK_S,))
        for (file_id,) in stale:
            async with db.transaction() as tx:
                await self.bodies.drop(tx, file_id)
                await tx.execute("DELETE FROM batch_file_uploads WHERE file_id = ?", (file_id,))
        return len(rows)


STALE_SLACK_S = 60.0  # past its timeout an upload may still be committing: its body is left alone this long more


class Upload:
    """One upload as it streams in: each piece checked against the bounds (lines, bytes, quota, disk) before it is
    written, the body written in CHUNK-byte pieces. `async with` aborts it unless it was committed."""

    def __init__(self, files: FileStore, team_id: str, file_id: str, used: int, writer: BodyWriter) -> None:
        self.files, self.team_id, self.file_id, self.used, self.writer = files, team_id, file_id, used, writer
        self.settings = files.settings
        self.size = 0
        self.lines = 0
        self.line_bytes = 0  # of the line not yet ended
        self.pending = bytearray()
        self.done = False

    async def __aenter__(self) -> Upload:
        return self

    async def __aexit__(self, *exc) -> None:
        if not self.done:
            await self.abort()

    async def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.settings.max_file_bytes:
            raise PayloadTooLarge(f"A file may hold at most {self.settings.max_file_bytes} bytes.", param="file")
        if (refused := self.files._over_quota(self.used, self.size)) is not None:
            raise refused
        self._count_lines(data)
        self.pending += data
        while len(self.pending) >= CHUNK:
            await self._flush(CHUNK)

    def _count_lines(self, data: bytes) -> None:
        """Lines counted with C-speed searches: a line is scanned for only where one could be over the bound."""
        first = data.find(b"\n")
        if first == -1:
            self.line_bytes += len(data)
            self._check_line()
            return
        self.line_bytes += first
        self._end_line()
        last = data.rfind(b"\n")
        start = first + 1
        if last - start > self.settings.max_line_bytes:  # a line between these two could be too long: each counted
            while (end := data.find(b"\n", start)) != -1:
                self.line_bytes = end - start
                self._end_line()
                start = end + 1
        else:
            self.lines += data.count(b"\n", start)
            if self.lines > self.settings.max_file_lines:
                raise TooManyLines(f"A batch file may hold at most {self.settings.max_file_lines} lines.",
                                   param="file")
        self.line_bytes = len(data) - last - 1
        self._check_line()

    def _check_line(self) -> None:
        if self.line_bytes > self.settings.max_line_bytes:
            raise LineTooLarge(f"Line {self.lines + 1} of the file is longer than {self.settings.max_line_bytes} "
                               "bytes (max_line_bytes).", param="file")

    def _end_line(self) -> None:
        self._check_line()
        self.lines += 1
        self.line_bytes = 0
        if self.lines > self.settings.max_file_lines:
            raise TooManyLines(f"A batch file may hold at most {self.settings.max_file_lines} lines.", param="file")

    async def _flush(self, size: int) -> None:
        """The first `size` pending bytes to the body (CHUNK-sized pieces but the last: a chunk row each)."""
        self.files._check_room(size)
        piece = bytes(self.pending[:size])
        del self.pending[:size]
        await self.writer.write(piece)

    async def commit(self, filename: str, purpose: str = "batch") -> dict:
        """The body whole and durable, then the file's row: from here on it is a file of the team."""
        if self.line_bytes or not self.lines:
            self._end_line()  # a last line without its newline (an empty file is one empty line, as before)
        if self.pending:
            await self._flush(len(self.pending))
        await self.writer.finish()
        db = await self.files.migrated()
        now = time.time()
        row = (self.file_id, self.team_id, purpose, filename[:MAX_FILENAME_CHARS], self.size, now,
               now + self.settings.file_retention_s)
        async with db.transaction(lock=f"batch-uploads:{self.team_id}") as tx:
            if (refused := self.files._over_quota(await self.files._used(tx, self.team_id, now), self.size)):
                raise refused
            await tx.execute(f"INSERT INTO batch_files ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)", row)
            await tx.execute("DELETE FROM batch_file_uploads WHERE file_id = ?", (self.file_id,))
        self._end()
        return file_object(row)

    def _end(self) -> None:
        if not self.done:
            self.done = True
            self.files.open_uploads -= 1

    async def abort(self) -> None:
        """Nothing of it kept: its body dropped, its place among the team's uploads given back."""
        self._end()
        db = await self.files.migrated()
        try:
            await self.writer.abort()
            async with db.transaction() as tx:
                await self.files.bodies.drop(tx, self.file_id)
        finally:
            await db.execute("DELETE FROM batch_file_uploads WHERE file_id = ?", (self.file_id,))
