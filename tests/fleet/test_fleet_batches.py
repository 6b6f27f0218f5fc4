"""Two gateways on one PostgreSQL share a batch (#48): both run its lines (claimed with FOR UPDATE SKIP LOCKED),
the worker receives each line exactly once, the batch ends with one output line per input line, and either
gateway serves the files (their bodies are in the database, not on one gateway's disk)."""

from __future__ import annotations

import asyncio
import io
import json
import time

import asyncpg
import openai

from testkit.admin import admin
from testkit.databases import create_database
from testkit.protocol_worker import MODEL, Reply, protocol_worker, tokens
from testkit.sluice import running_sluice
from testkit.stub_gateway import ADMIN_KEY

LINES = 60


async def _owners(url: str, batch_id: str) -> set[str]:
    connection = await asyncpg.connect(url)
    try:
        rows = await connection.fetch("SELECT DISTINCT owner FROM batch_lines WHERE batch_id = $1", batch_id)
    finally:
        await connection.close()
    return {row["owner"] for row in rows}


def test_two_gateways_share_a_batch_and_no_line_runs_twice(tmp_path, postgres):
    database = asyncio.run(create_database(postgres.url, "batches"))
    with protocol_worker(replies=[Reply(tokens("one two three"), pause_s=0.01)]) as worker:
        config = (f'database_url = "{database}"\ndefault_team_limits = {{}}\nrejections_per_minute = 1000000\n'
                  f'[batches]\npoll_interval_s = 0.1\nin_flight_per_endpoint = 2\n'
                  f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker.url}"] }}\n')
        env = {"SLUICE_ADMIN_KEY": ADMIN_KEY, "SLUICE_KEY_PEPPER": "batch-fleet-pepper"}  # one pepper: one key
        with running_sluice(tmp_path / "a", config=config, env=env) as first, \
                running_sluice(tmp_path / "b", config=config, env=env) as second:
            team = admin(first, "POST", "/admin/teams", name="fleet-batch")["id"]
            key = admin(first, "POST", "/admin/keys", name="k", team_id=team)["key"]
            api = openai.OpenAI(base_url=f"{first.url}/v1", api_key=key, max_retries=0, timeout=60)
            body = b"".join(json.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/completions",
                                        "body": {"model": MODEL, "prompt": f"p{i}", "max_tokens": 4}}).encode() + b"\n"
                            for i in range(LINES))
            file_id = api.files.create(file=("in.jsonl", io.BytesIO(body)), purpose="batch").id
            batch = api.batches.create(input_file_id=file_id, endpoint="/v1/completions", completion_window="24h")
            deadline = time.monotonic() + 300
            while (batch := api.batches.retrieve(batch.id)).status != "completed":
                assert batch.status == "in_progress" or batch.status == "finalizing", batch
                assert time.monotonic() < deadline, batch
                time.sleep(0.2)
            assert batch.request_counts.completed == LINES
            output = [json.loads(row) for row in api.files.content(batch.output_file_id).text.splitlines()]
            assert sorted(line["custom_id"] for line in output) == sorted(f"l{i}" for i in range(LINES))
            # the files live in the database the gateways share, not on one gateway's disk
            other = openai.OpenAI(base_url=f"{second.url}/v1", api_key=key, max_retries=0, timeout=60)
            assert other.files.content(batch.output_file_id).text == api.files.content(batch.output_file_id).text
            assert other.files.content(file_id).content == body
            sent = [request["request_id"] for request in worker.requests]
            assert len(sent) == len(set(sent)) == LINES  # no line reached the worker twice
            assert len(asyncio.run(_owners(database, batch.id))) == 2  # both gateways ran lines
