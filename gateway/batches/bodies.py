"""Where file bodies live, one of three places, each written and read in CHUNK-sized pieces so no body is ever
whole in memory:
- `DiskBodies`: `<data dir>/batch_files/` (SQLite, one host). An upload is written to `.<id>.part` and renamed
  once complete and flushed: a crash leaves no half body under a file's name.
- `DatabaseBodies`: CHUNK-byte rows of `batch_file_bodies` (PostgreSQL without a bucket: a fleet shares the
  database, not a disk).
- `S3Bodies`: one object per file under `file_prefix` in `file_bucket` (a fleet's gateways share it); an upload is
  an S3 multipart upload of PART-byte parts, visible only once completed.
A body is never a file by itself: the file is its `batch_files` row (files.py), written after the body is whole.
Bodies of uploads cut short (a gateway killed mid-upload) are dropped by the sweep of stale uploads."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

import structlog

from common.errors import SluiceError
from storage import Database

log = structlog.get_logger(__name__)

CHUNK = 1 << 20
PART = 8 << 20  # an S3 part: at least 5 MiB but the last; at most this much of an upload is held per writer


class BodyWriter(Protocol):
    async def write(self, data: bytes) -> None: ...
    async def finish(self) -> None: ...  # whole and durable; readable once the file's row exists
    async def abort(self) -> None: ...


class Bodies(Protocol):
    def writer(self, file_id: str) -> BodyWriter: ...
    async def put(self, tx: Any, file_id: str, body: bytes) -> None: ...  # a produced file, whole
    def chunks(self, file_id: str) -> AsyncIterator[bytes]: ...
    async def drop(self, tx: Any, file_id: str) -> None: ...


class DiskBodies:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, file_id: str) -> Path:
        return self.root / f"{file_id}.jsonl"

    def writer(self, file_id: str) -> BodyWriter:
        self.root.mkdir(parents=True, exist_ok=True)
        return _DiskWriter(self.root / f".{file_id}.part", self.path(file_id))

    async def put(self, tx: Any, file_id: str, body: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = self.root / f".{file_id}.{secrets.token_hex(4)}.part"  # two finalizers: each its own
        await asyncio.to_thread(_write_whole, temporary, self.path(file_id), body)

    async def chunks(self, file_id: str) -> AsyncIterator[bytes]:
        source = await asyncio.to_thread(open, self.path(file_id), "rb")
        try:
            while data := await asyncio.to_thread(source.read, CHUNK):
                yield data
        finally:
            source.close()

    async def drop(self, tx: Any, file_id: str) -> None:
        self.path(file_id).unlink(missing_ok=True)
        (self.root / f".{file_id}.part").unlink(missing_ok=True)


class _DiskWriter:
    def __init__(self, temporary: Path, final: Path) -> None:
        self.temporary, self.final = temporary, final
        self.out = open(temporary, "wb")  # noqa: SIM115 - closed by finish() or abort()

    async def write(self, data: bytes) -> None:
        await asyncio.to_thread(self.out.write, data)

    async def finish(self) -> None:
        await asyncio.to_thread(self._flush_and_rename)

    def _flush_and_rename(self) -> None:
        with self.out:
            self.out.flush()
            os.fsync(self.out.fileno())
        os.replace(self.temporary, self.final)

    async def abort(self) -> None:
        self.out.close()
        self.temporary.unlink(missing_ok=True)


def _write_whole(temporary: Path, final: Path, body: bytes) -> None:
    with open(temporary, "wb") as out:
        out.write(body)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, final)


class DatabaseBodies:
    def __init__(self, db: Database) -> None:
        self.db = db

    def writer(self, file_id: str) -> BodyWriter:
        return _DatabaseWriter(self.db, file_id)

    async def put(self, tx: Any, file_id: str, body: bytes) -> None:
        await tx.executemany("INSERT INTO batch_file_bodies (file_id, seq, data) VALUES (?, ?, ?)",
                             [(file_id, seq, body[start:start + CHUNK])
                              for seq, start in enumerate(range(0, len(body), CHUNK))])

    async def chunks(self, file_id: str) -> AsyncIterator[bytes]:
        seq = 0
        while (row := await self.db.fetchone("SELECT data FROM batch_file_bodies WHERE file_id = ? AND seq = ?",
                                             (file_id, seq))) is not None:
            yield bytes(row[0])
            seq += 1

    async def drop(self, tx: Any, file_id: str) -> None:
        await tx.execute("DELETE FROM batch_file_bodies WHERE file_id = ?", (file_id,))


class _DatabaseWriter:
    """Each chunk its own short transaction (no connection held for an upload's length); until the file's row is
    written the chunks belong to no file, and a cut upload's are dropped with it."""

    def __init__(self, db: Database, file_id: str) -> None:
        self.db, self.file_id, self.seq = db, file_id, 0

    async def write(self, data: bytes) -> None:
        await self.db.execute("INSERT INTO batch_file_bodies (file_id, seq, data) VALUES (?, ?, ?)",
                              (self.file_id, self.seq, data))
        self.seq += 1

    async def finish(self) -> None:
        return None

    async def abort(self) -> None:
        await self.db.execute("DELETE FROM batch_file_bodies WHERE file_id = ?", (self.file_id,))


class FileStorageUnavailable(SluiceError):
    """The bucket refused or could not be reached: the caller's request fails cleanly, never a 500."""
    status, type, code = 503, "service_unavailable", "file_storage_unavailable"
    retry_after_s = 30.0


class S3Bodies:
    def __init__(self, bucket: str, prefix: str, endpoint_url: str = "") -> None:
        import boto3  # only a gateway configured with a bucket needs it loaded

        self.bucket, self.prefix = bucket, prefix
        self.s3 = boto3.client("s3", endpoint_url=endpoint_url or None)

    def key(self, file_id: str) -> str:
        return f"{self.prefix}{file_id}.jsonl"

    async def call(self, work: Callable[..., Any], **arguments: Any) -> Any:
        """One S3 call off the event loop; whatever S3 or the network answers wrong is FileStorageUnavailable (the
        operator reads why in the log: a policy, a key, the network)."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return await asyncio.to_thread(work, **arguments)
        except (BotoCoreError, ClientError) as error:
            log.warning("batch_file_storage_failed", call=getattr(work, "__name__", "?"), error=str(error)[:500])
            raise FileStorageUnavailable("The file storage is unavailable; retry later.") from error

    def writer(self, file_id: str) -> BodyWriter:
        return _S3Writer(self, self.key(file_id))

    async def put(self, tx: Any, file_id: str, body: bytes) -> None:
        await self.call(self.s3.put_object, Bucket=self.bucket, Key=self.key(file_id), Body=body)

    async def chunks(self, file_id: str) -> AsyncIterator[bytes]:
        answer = await self.call(self.s3.get_object, Bucket=self.bucket, Key=self.key(file_id))
        stream = answer["Body"]
        try:
            while data := await self.call(stream.read, amt=CHUNK):
                yield data
        finally:
            stream.close()

    async def drop(self, tx: Any, file_id: str) -> None:
        await self.call(self._drop, key=self.key(file_id))

    def _drop(self, key: str) -> None:
        self.s3.delete_object(Bucket=self.bucket, Key=key)
        listed = self.s3.list_multipart_uploads(Bucket=self.bucket, Prefix=key)
        for upload in listed.get("Uploads", []):  # an upload a killed gateway left open
            if upload["Key"] == key:
                self.s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload["UploadId"])


class _S3Writer:
    def __init__(self, bodies: S3Bodies, key: str) -> None:
        self.bodies, self.key = bodies, key
        self.pending = bytearray()
        self.upload_id: str | None = None
        self.parts: list[dict] = []

    async def write(self, data: bytes) -> None:
        self.pending += data
        if len(self.pending) >= PART:
            await self._send_part()

    async def _send_part(self) -> None:
        bodies, s3, bucket = self.bodies, self.bodies.s3, self.bodies.bucket
        if self.upload_id is None:
            started = await bodies.call(s3.create_multipart_upload, Bucket=bucket, Key=self.key)
            self.upload_id = started["UploadId"]
        number = len(self.parts) + 1
        sent = await bodies.call(s3.upload_part, Bucket=bucket, Key=self.key, UploadId=self.upload_id,
                                 PartNumber=number, Body=bytes(self.pending))
        self.parts.append({"PartNumber": number, "ETag": sent["ETag"]})
        self.pending = bytearray()

    async def finish(self) -> None:
        bodies, s3, bucket = self.bodies, self.bodies.s3, self.bodies.bucket
        if self.upload_id is None:  # under one part: one plain object
            await bodies.call(s3.put_object, Bucket=bucket, Key=self.key, Body=bytes(self.pending))
            return
        if self.pending:
            await self._send_part()
        await bodies.call(s3.complete_multipart_upload, Bucket=bucket, Key=self.key, UploadId=self.upload_id,
                          MultipartUpload={"Parts": self.parts})

    async def abort(self) -> None:
        if self.upload_id is not None:
            await self.bodies.call(self.bodies.s3.abort_multipart_upload, Bucket=self.bodies.bucket, Key=self.key,
                                   UploadId=self.upload_id)


def open_bodies(db: Database, root: Path, bucket: str, prefix: str, endpoint_url: str) -> Bodies:
    if bucket:
        return S3Bodies(bucket, prefix, endpoint_url)
    return DiskBodies(root) if db.dialect == "sqlite" else DatabaseBodies(db)
