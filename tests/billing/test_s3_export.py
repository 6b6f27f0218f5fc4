"""The daily S3 export against a real S3 API (moto's server): one gzipped JSON-lines object per team
and day, the same bytes when rerun, updated when late records arrive; and its CLI command."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from billing.exports.s3 import export_day
from billing.ledger import Ledger
from billing.usage import UsageQuery
from tests.billing.factory import usage
from tests.billing.http import ts

DAY = date(2025, 3, 10)
ROOT = Path(__file__).resolve().parents[2]


def read_lines(s3, bucket: str, key: str) -> list[dict]:
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    return [json.loads(line) for line in gzip.decompress(body).splitlines()]


async def record(ledger, records) -> None:
    for r in records:
        await ledger.record(r)
    await ledger.flush(10)


@pytest.fixture
def bucket(s3, request) -> str:
    name = f"usage-{request.node.name.lower().replace('[', '-').replace(']', '')}"[:60].rstrip("-")
    s3.create_bucket(Bucket=name)
    return name


async def test_export_is_per_team_and_day_and_idempotent(ledger, s3, bucket):
    records = [usage(request_id=f"a-{i}", team_id="team-a", time=ts("2025-03-10T00:00:00") + i * 3000,
                     prompt_tokens=i, cold_start_ms=1.5 if i == 3 else None, adapter="sql-lora" if i == 4 else "")
               for i in range(20)]
    records += [usage(request_id="b-1", team_id="team-b", time=ts("2025-03-10T23:59:59.5")),
                usage(request_id="a-yesterday", team_id="team-a", time=ts("2025-03-09T23:59:59")),
                usage(request_id="a-tomorrow", team_id="team-a", time=ts("2025-03-11T00:00:00"))]
    await record(ledger, records)
    first = await export_day(ledger.store, s3, bucket, DAY, prefix="usage/")
    assert [(o.team_id, o.key, o.records, o.uploaded) for o in first] == [
        ("team-a", "usage/team-a/2025-03-10.jsonl.gz", 20, True),
        ("team-b", "usage/team-b/2025-03-10.jsonl.gz", 1, True)]
    lines = read_lines(s3, bucket, "usage/team-a/2025-03-10.jsonl.gz")
    assert [line["request_id"] for line in lines] == [f"a-{i}" for i in range(20)]  # oldest first
    stored = {e.usage.request_id: e.flat() for e in await ledger.records(UsageQuery(start=0.0, end=4e9))}
    assert lines == [stored[line["request_id"]] for line in lines]  # every field, as the records API names it
    assert lines[3]["cold_start_ms"] == 1.5 and lines[4]["adapter"] == "sql-lora"
    head = s3.head_object(Bucket=bucket, Key="usage/team-a/2025-03-10.jsonl.gz")
    assert head["ContentType"] == "application/gzip" and head["Metadata"]["records"] == "20"

    bytes_before = s3.get_object(Bucket=bucket, Key="usage/team-a/2025-03-10.jsonl.gz")["Body"].read()
    again = await export_day(ledger.store, s3, bucket, DAY, prefix="usage/")
    assert [(o.key, o.sha256, o.uploaded) for o in again] == [(o.key, o.sha256, False) for o in first]
    assert s3.get_object(Bucket=bucket, Key="usage/team-a/2025-03-10.jsonl.gz")["Body"].read() == bytes_before
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(keys) == ["usage/team-a/2025-03-10.jsonl.gz", "usage/team-b/2025-03-10.jsonl.gz"]  # no duplicates

    # a request that began before midnight and was billed after the export: a rerun adds it, once
    await record(ledger, [usage(request_id="a-late", team_id="team-a", time=ts("2025-03-10T23:59:00"))])
    late = await export_day(ledger.store, s3, bucket, DAY, prefix="usage/", team_ids=["team-a"])
    assert [(o.records, o.uploaded) for o in late] == [(21, True)]
    assert [line["request_id"] for line in read_lines(s3, bucket, late[0].key)][-1] == "a-late"


async def test_a_day_without_usage_writes_nothing(ledger, s3, bucket):
    assert await export_day(ledger.store, s3, bucket, date(2020, 1, 1)) == []
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0


def sluice(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gateway.cli.main", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


async def test_cli_exports_a_day_and_prints_a_statement(s3, s3_endpoint, bucket, tmp_path, wal_dir, pricing):
    # one store is enough here: the command runs the same export_day as above, which both stores pass
    database_url = f"sqlite:///{tmp_path / 'cli.db'}"
    ledger = await Ledger.open(database_url, wal_dir, pricing)
    try:
        await record(ledger, [usage(request_id="cli-1", team_id="team-a", time=ts("2025-03-10T12:00:00"),
                                    model="small", prompt_tokens=1000, completion_tokens=10, compute_tokens=10)])
    finally:
        await ledger.close()
    env = {**os.environ, "SLUICE_DATABASE_URL": database_url, "SLUICE_DATA_DIR": str(tmp_path / "data")}
    run = sluice("usage", "export", "--date", "2025-03-10", "--bucket", bucket, "--endpoint-url", s3_endpoint,
                 "--json", env=env)
    assert run.returncode == 0, run.stderr
    assert [(o["key"], o["records"]) for o in json.loads(run.stdout)] == [("team-a/2025-03-10.jsonl.gz", 1)]
    assert read_lines(s3, bucket, "team-a/2025-03-10.jsonl.gz")[0]["request_id"] == "cli-1"
    rerun = sluice("usage", "export", "--date", "2025-03-10", "--bucket", bucket, "--endpoint-url", s3_endpoint,
                   env=env)
    assert rerun.returncode == 0 and "unchanged" in rerun.stdout, rerun.stdout + rerun.stderr

    statement = sluice("usage", "statement", "--team-id", "team-a", "--month", "2025-03", env=env)
    assert statement.returncode == 0, statement.stderr
    assert statement.stdout.splitlines()[0].startswith("model,input_price_micros")
    assert statement.stdout.splitlines()[1].startswith("small,100000,400000,1,1000,10,")

    for args, message in ((["usage", "export", "--date", "2025-02-30", "--bucket", bucket], "YYYY-MM-DD"),
                          (["usage", "export", "--date", "2025-03-10", "--bucket", "no-such-bucket",
                            "--endpoint-url", s3_endpoint], "NoSuchBucket"),
                          (["usage", "statement", "--team-id", "t", "--month", "2025-13"], "month")):
        failed = sluice(*args, env=env)
        assert failed.returncode != 0 and message in failed.stderr, failed.stderr
        assert "Traceback" not in failed.stderr
