"""File bodies in each of their three homes (the data dir with SQLite, the database with PostgreSQL, S3 through
moto's server beside either database): an upload streamed in pieces reads back in chunks, is nobody's file until
committed, and every bound of an upload (line length, line count, file size, the team's quota, the uploads in
progress of a team and of a process) refuses it as the bytes arrive and keeps nothing of it; an upload whose
gateway died leaves no file and its body is dropped by the sweep (gateway/batches/files.py, bodies.py)."""

from __future__ import annotations

import asyncio
import contextlib
import random

import boto3
import pytest

import storage
from common.errors import PayloadTooLarge
from gateway.batches.bodies import CHUNK, DatabaseBodies, DiskBodies, FileStorageUnavailable, S3Bodies
from gateway.batches.files import (
    STALE_SLACK_S,
    FileQuotaExceeded,
    FileStore,
    LineTooLarge,
    TooManyLines,
    TooManyUploads,
)
from gateway.config import BatchSettings
from testkit.databases import fresh_database
from testkit.local_aws import moto_server

BUCKET = "sluice-files"
LINE = b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


@pytest.fixture(scope="module")
def s3_endpoint():
    with moto_server() as url:
        yield url


@pytest.fixture(params=["disk", "database", "s3", "s3-postgres"])
async def home(request, tmp_path, monkeypatch):
    """(database, bodies) of one home; S3 beside SQLite or PostgreSQL (a fleet: the bucket holds the bodies)."""
    async with contextlib.AsyncExitStack() as stack:
        if request.param in ("database", "s3-postgres"):
            url = await stack.enter_async_context(fresh_database(request.getfixturevalue("postgres"), "files"))
        else:
            url = f"sqlite:///{tmp_path}/files.db"
        db = await storage.open(url)
        stack.push_async_callback(db.close)
        if request.param == "disk":
            yield db, DiskBodies(tmp_path / "batch_files")
        elif request.param == "database":
            yield db, DatabaseBodies(db)
        else:
            for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                                "AWS_DEFAULT_REGION": "us-east-1"}.items():
                monkeypatch.setenv(name, value)
            endpoint = request.getfixturevalue("s3_endpoint")
            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
            yield db, S3Bodies(BUCKET, f"{request.node.name[-40:]}/", endpoint)


def files_of(home, **bounds) -> FileStore:
    db, bodies = home
    settings = {"max_file_bytes": 64 << 20, "max_file_lines": 1_000_000, "max_line_bytes": 4096, **bounds}
    return FileStore(db, bodies, BatchSettings(**settings), floor_bytes=0)


async def stored_bodies(home) -> list:
    """Whatever bodies the home holds, whole or in part: what a refused or dead upload must not leave."""
    db, bodies = home
    if isinstance(bodies, DiskBodies):
        return sorted(path.name for path in bodies.root.iterdir()) if bodies.root.exists() else []
    if isinstance(bodies, DatabaseBodies):
        return await db.fetchall("SELECT DISTINCT file_id FROM batch_file_bodies")
    listed = bodies.s3.list_objects_v2(Bucket=BUCKET, Prefix=bodies.prefix).get("Contents", [])
    parts = bodies.s3.list_multipart_uploads(Bucket=BUCKET, Prefix=bodies.prefix).get("Uploads", [])
    return [item["Key"] for item in listed] + [item["Key"] for item in parts]


async def test_a_streamed_upload_reads_back_in_chunks_and_only_for_its_team(home):
    files = files_of(home)
    body = LINE * ((10 << 20) // len(LINE))  # past one S3 part: a multipart upload there
    upload = await files.begin_upload("team_a")
    async with upload:
        for start in range(0, len(body), 60_000):
            await upload.write(body[start:start + 60_000])
        assert await files.list("team_a", None, None, 10, True) == ([], False)  # no file before its commit
        made = await upload.commit("in.jsonl")
    assert made["bytes"] == len(body) and made["filename"] == "in.jsonl"
    pieces = [piece async for piece in files.chunks(made["id"])]
    assert b"".join(pieces) == body and max(map(len, pieces)) <= CHUNK
    assert await files.get("team_b", made["id"]) is None  # another team's file is unknown
    assert not await files.delete("team_b", made["id"])
    assert await files.delete("team_a", made["id"])
    assert await stored_bodies(home) == []


@pytest.mark.parametrize(("bounds", "pieces", "refusal"), [
    ({"max_line_bytes": 1024}, [b"{" + b"x" * 600, b"y" * 600], LineTooLarge),  # a line split over two pieces
    ({"max_line_bytes": 1024}, [b"{}\n" + b"x" * 1100 + b"\n{}\n"], LineTooLarge),  # inside one piece
    ({"max_file_lines": 3}, [LINE * 3, b"{}"], TooManyLines),  # a fourth line without its newline
    ({"max_file_lines": 3}, [b"{}\n" * 4], TooManyLines),
    ({"max_file_bytes": 1024}, [LINE * 10, LINE * 10], PayloadTooLarge),
    ({"team_max_file_bytes": 1000}, [LINE * 8, LINE * 8], FileQuotaExceeded),
])
async def test_each_bound_refuses_as_bytes_arrive_and_keeps_nothing(home, bounds, pieces, refusal):
    files = files_of(home, **bounds)
    with pytest.raises(refusal):
        upload = await files.begin_upload("team_a")
        async with upload:
            for piece in pieces:
                await upload.write(piece)
            await upload.commit("in.jsonl")
    assert await files.list("team_a", None, None, 10, True) == ([], False)
    assert await stored_bodies(home) == []
    await files.create("team_a", "batch", "ok.jsonl", LINE)  # its place among the uploads in progress given back


async def test_quota_counts_the_files_kept_and_is_checked_again_at_commit(home):
    files = files_of(home, team_max_file_bytes=len(LINE) * 3)
    first, second = await files.begin_upload("team_a"), await files.begin_upload("team_a")
    await first.write(LINE * 2)
    await second.write(LINE * 2)  # each fits alone; both together do not
    await first.commit("a.jsonl")
    with pytest.raises(FileQuotaExceeded):
        async with second:
            await second.commit("b.jsonl")
    assert [row[3] for row in (await files.list("team_a", None, None, 10, True))[0]] == ["a.jsonl"]
    await files.create("team_b", "batch", "b.jsonl", LINE * 3)  # another team's quota is its own


async def test_uploads_in_progress_are_bounded_per_team(home):
    files = files_of(home, team_max_concurrent_uploads=2)
    running = [await files.begin_upload("team_a"), await files.begin_upload("team_a")]
    with pytest.raises(TooManyUploads):
        await files.begin_upload("team_a")
    other = await files.begin_upload("team_b")  # another team's uploads are counted apart
    await other.abort()
    await running[0].abort()
    third = await files.begin_upload("team_a")
    await third.write(LINE)
    await third.commit("c.jsonl")
    await running[1].abort()


async def test_an_upload_cut_by_a_dead_gateway_leaves_no_file_and_is_swept(home):
    files = files_of(home, team_max_concurrent_uploads=1, upload_timeout_s=1)
    dead = await files.begin_upload("team_a")
    await dead.write(LINE * ((9 << 20) // len(LINE)))  # on disk, in chunk rows, in an open S3 multipart upload
    await dead._flush(len(dead.pending))
    # the gateway dies here: no abort, no commit
    assert await files.list("team_a", None, None, 10, True) == ([], False)
    assert await stored_bodies(home) != []
    db, _ = home
    await db.execute("UPDATE batch_file_uploads SET started_at = started_at - ?", (STALE_SLACK_S + 5,))
    await files.purge_expired()
    assert await stored_bodies(home) == []
    await files.create("team_a", "batch", "next.jsonl", LINE)  # its place given back


async def test_a_produced_file_is_written_once_whoever_finalizes_and_whatever_the_quota(home):
    files = files_of(home, team_max_file_bytes=0)
    body = LINE * ((3 << 20) // len(LINE))
    made = await asyncio.gather(*(files.create("team_a", "batch_output", "out.jsonl", body, produced=True,
                                               file_id="file-batch_x_output") for _ in range(2)))
    assert made[0] == made[1] and made[0]["bytes"] == len(body)
    assert b"".join([piece async for piece in files.chunks("file-batch_x_output")]) == body
    assert await files.get("team_b", "file-batch_x_output") is None


async def test_lines_are_counted_alike_however_the_pieces_fall(tmp_path):
    db = await storage.open(f"sqlite:///{tmp_path}/files.db")
    try:
        files = files_of((db, DiskBodies(tmp_path / "bodies")), max_line_bytes=1024)
        rng = random.Random(48)
        text = b"".join(b"x" * rng.choice([0, 1, 5, 300, 1024]) + b"\n" for _ in range(500))
        for trial in range(5):
            upload = await files.begin_upload("team_a")
            async with upload:
                cuts = sorted(rng.sample(range(1, len(text)), 40 * trial + 1))
                for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
                    await upload.write(text[start:end])
                assert upload.lines == 500 and upload.line_bytes == 0
    finally:
        await db.close()


async def test_one_process_takes_a_bounded_number_of_uploads_of_every_team(home):
    files = files_of(home, max_concurrent_uploads=2)
    first, second = await files.begin_upload("team_a"), await files.begin_upload("team_b")
    with pytest.raises(TooManyUploads):
        await files.begin_upload("team_c")
    await first.write(LINE)
    await first.commit("a.jsonl")
    third = await files.begin_upload("team_c")
    await second.abort()
    await third.abort()
    assert files.open_uploads == 0


async def test_a_bucket_that_refuses_is_a_clean_503_not_a_500(s3_endpoint, tmp_path, monkeypatch):
    """A bucket that is not there (or a policy that refuses: the same ClientError) fails the upload, the read and
    the delete with FileStorageUnavailable (503 `file_storage_unavailable`), and no file is left behind."""
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(name, value)
    db = await storage.open(f"sqlite:///{tmp_path}/files.db")
    try:
        bodies = S3Bodies("no-such-bucket", "x/", s3_endpoint)
        files = files_of((db, bodies))
        upload = await files.begin_upload("team_a")
        with pytest.raises(FileStorageUnavailable) as refused:
            async with upload:
                await upload.write(LINE)
                await upload.commit("in.jsonl")
        assert (refused.value.status, refused.value.code) == (503, "file_storage_unavailable")
        assert await files.list("team_a", None, None, 10, True) == ([], False)
        with pytest.raises(FileStorageUnavailable):
            [piece async for piece in bodies.chunks("file-abc")]
        with pytest.raises(FileStorageUnavailable):
            await bodies.drop(None, "file-abc")
    finally:
        await db.close()
