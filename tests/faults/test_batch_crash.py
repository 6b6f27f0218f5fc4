"""A gateway SIGKILLed three times in the middle of a batch (#48): each start resumes it (lines claimed by the
dead process come back when their leases lapse), and the batch ends with exactly one output line and exactly one
ledger record per input line. `make test` runs 90 lines; SLUICE_BATCH_CRASH_LINES=2000 runs the issue's size."""

from __future__ import annotations

import io
import json
import os
import signal
import time

import httpx
import openai

from testkit.admin import admin
from testkit.protocol_worker import MODEL, worker_process
from testkit.sluice import start_sluice
from testkit.stub_gateway import ADMIN_KEY

LINES = int(os.environ.get("SLUICE_BATCH_CRASH_LINES", "90"))
KILLS = 3


def _progress(server, key: str, batch_id: str) -> dict:
    answer = httpx.get(f"{server.url}/v1/batches/{batch_id}", headers={"authorization": f"Bearer {key}"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()


def _records(server, key: str) -> list[dict]:
    records, cursor = [], None
    while True:
        params = {"limit": 10_000, **({"cursor": cursor} if cursor else {})}
        answer = httpx.get(f"{server.url}/v1/usage/requests", headers={"authorization": f"Bearer {key}"},
                           params=params, timeout=60)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        records += page["data"]
        if not page["has_more"]:
            return records
        cursor = page["next_cursor"]


def test_a_batch_survives_three_sigkills_with_one_output_and_one_record_per_line(tmp_path):
    with worker_process(token_delay=0.002, quiet=True) as worker:
        config = (f'default_team_limits = {{}}\nrejections_per_minute = 1000000\n'
                  f'[batches]\nlease_s = 2\npoll_interval_s = 0.2\nin_flight_per_endpoint = 8\n'
                  f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker.url}"] }}\n')
        env = {"SLUICE_ADMIN_KEY": ADMIN_KEY}
        server = start_sluice(tmp_path, config=config, env=env)
        try:
            team = admin(server, "POST", "/admin/teams", name="crash")["id"]
            key = admin(server, "POST", "/admin/keys", name="crash-key", team_id=team)["key"]
            api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)
            body = b"".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                                        "body": {"model": MODEL, "max_tokens": 8,
                                                 "messages": [{"role": "user", "content": f"n{i}"}]}}).encode()
                            + b"\n" for i in range(LINES))
            file_id = api.files.create(file=("in.jsonl", io.BytesIO(body)), purpose="batch").id
            batch_id = api.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                          completion_window="24h").id
            for kill in range(KILLS):
                target = LINES * (kill + 1) // (KILLS + 1)
                deadline = time.monotonic() + 300
                while _progress(server, key, batch_id)["request_counts"]["completed"] < target:
                    assert time.monotonic() < deadline, server.output[-3000:]
                    time.sleep(0.05)
                server.stop(signal.SIGKILL)
                server = start_sluice(tmp_path, config=config, env=env)
            deadline = time.monotonic() + 600
            while (batch := _progress(server, key, batch_id))["status"] != "completed":
                assert batch["status"] in ("in_progress", "finalizing"), batch
                assert time.monotonic() < deadline, batch
                time.sleep(0.2)
            assert batch["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
            api = openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0, timeout=60)
            output = [json.loads(row) for row in api.files.content(batch["output_file_id"]).text.splitlines()]
            assert sorted(line["custom_id"] for line in output) == sorted(f"line-{i}" for i in range(LINES))
            assert batch["error_file_id"] is None
            deadline = time.monotonic() + 60
            while len(records := _records(server, key)) < LINES and time.monotonic() < deadline:
                time.sleep(0.5)
            assert len(records) == LINES, len(records)
            assert {r["request_id"] for r in records} == {line["response"]["request_id"] for line in output}
            assert all(r["status"] == "ok" for r in records)
            # each record carries its line's mark: the batch and the custom_id it answered
            assert {(r["batch_id"], r["custom_id"]) for r in records} == {(batch_id, f"line-{i}") for i in range(LINES)}
        finally:
            server.stop(signal.SIGKILL)
