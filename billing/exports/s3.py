"""The daily S3 export: each team's records of one UTC day as gzipped JSON lines, one object per
team at `<prefix><team>/<yyyy-mm-dd>.jsonl.gz`.

Idempotent: the bytes depend only on the records (ordered by time and request id, fixed field
order, gzip without a timestamp or file name), so a rerun writes the same object under the same
key, never a second copy. An object whose bytes are already there (its sha256 is kept in the
object's metadata) is not uploaded again. A rerun after late records arrived (a request that began
before midnight and was billed after the export) replaces the object with one that has them too.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import tempfile
from datetime import UTC, date, datetime, timedelta
from typing import IO, Any
from urllib.parse import quote

import msgspec

from billing.filters import Selection
from billing.insights.requests import every_page
from billing.store.base import TABLE, UsageStore
from storage.sql_dialect import Params

CONTENT_TYPE = "application/gzip"
_SPOOL_BYTES = 16 << 20  # bigger days go to a temporary file, not memory
_HASH_CHUNK = 1 << 20


class ExportedObject(msgspec.Struct):
    team_id: str
    key: str
    records: int
    bytes: int
    sha256: str
    uploaded: bool  # False: the same bytes were already there


def day_window(day: date) -> tuple[float, float]:
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return start.timestamp(), (start + timedelta(days=1)).timestamp()


def object_key(prefix: str, team_id: str, day: date) -> str:
    return f"{prefix}{quote(team_id, safe='')}/{day.isoformat()}.jsonl.gz"


async def teams_with_usage(store: UsageStore, start: float, end: float) -> list[str]:
    params = Params(store.dialect)
    rows = await store.fetch(f"SELECT DISTINCT team_id FROM {TABLE} WHERE time >= {params(start)} "
                             f"AND time < {params(end)}", params.values)
    return sorted(r[0] for r in rows)


async def export_day(store: UsageStore, s3: Any, bucket: str, day: date, *, prefix: str = "",
                     team_ids: list[str] | None = None) -> list[ExportedObject]:
    """Export `day` (UTC) for every team with usage that day, or for `team_ids`. `s3` is a boto3 S3
    client (its calls run in a thread)."""
    start, end = day_window(day)
    teams = sorted(team_ids) if team_ids is not None else await teams_with_usage(store, start, end)
    exported = []
    for team_id in teams:
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as spool:
            records = await _write_gzipped_lines(store, Selection(start, end, team_id), spool)
            size, digest = await asyncio.to_thread(_size_and_sha256, spool)
            key = object_key(prefix, team_id, day)
            uploaded = await asyncio.to_thread(_upload_unless_same, s3, bucket, key, spool, digest, records)
        exported.append(ExportedObject(team_id, key, records, size, digest, uploaded))
    return exported


async def _write_gzipped_lines(store: UsageStore, selection: Selection, spool: IO[bytes]) -> int:
    encoder = msgspec.json.Encoder()
    records = 0
    # mtime=0 and no file name: the gzip header carries nothing that changes between runs
    with gzip.GzipFile(filename="", mode="wb", fileobj=spool, mtime=0, compresslevel=6) as zipped:
        async for entries in every_page(store, selection):
            lines = b"".join(encoder.encode(e.flat()) + b"\n" for e in entries)
            await asyncio.to_thread(zipped.write, lines)
            records += len(entries)
    return records


def _size_and_sha256(spool: IO[bytes]) -> tuple[int, str]:
    spool.seek(0)
    digest, size = hashlib.sha256(), 0
    while chunk := spool.read(_HASH_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return size, digest.hexdigest()


def _upload_unless_same(s3: Any, bucket: str, key: str, spool: IO[bytes], digest: str, records: int) -> bool:
    try:
        if s3.head_object(Bucket=bucket, Key=key).get("Metadata", {}).get("sha256") == digest:
            return False
    except s3.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchKey", "NotFound"):
            raise
    spool.seek(0)
    s3.upload_fileobj(spool, bucket, key, ExtraArgs={
        "ContentType": CONTENT_TYPE, "Metadata": {"sha256": digest, "records": str(records)}})
    return True
