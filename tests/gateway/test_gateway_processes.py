"""`gateway_processes`: several `sluice serve` processes on one port share the limits (Redis) and each keeps
its own usage log, every request billed once; SIGTERM to the first stops them all. The settings that cannot
work with more than one process are refused at start-up."""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import httpx
import pytest

from gateway.config import load_settings
from testkit.protocol_worker import worker_process
from testkit.sluice import start_sluice

ADMIN_KEY = "processes-test-admin-key-0123456789abcdef"
REMOTE = '[[models]]\nname = "stub-model"\nprovisioner = { kind = "static", urls = ["http://127.0.0.1:9"] }\n'


@pytest.mark.parametrize(("config", "message"), [
    ("gateway_processes = 2\n" + REMOTE, "needs redis_url"),
    ('gateway_processes = 2\nredis_url = "redis://127.0.0.1:9/0"\n', "SmolLM2-135M-Instruct' has local workers"),
    ("gateway_processes = 0\n", "gateway_processes"),
    ("gateway_processes = 65\n", "gateway_processes"),
])
def test_settings_more_than_one_process_cannot_work_with_are_refused(tmp_path, config, message):
    path = tmp_path / "sluice.toml"
    path.write_text(config)
    with pytest.raises(SystemExit, match=message):
        load_settings(str(path))


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, ValueError):
                continue
    return found


@pytest.fixture(scope="module")
def worker_url():
    """A protocol worker process that answers at once."""
    with worker_process(token_delay=0, quiet=True) as worker:
        yield worker.url


def two_processes(data_dir, redis, worker_url):
    """`sluice serve` with gateway_processes = 2, once both processes serve; and the second one's pid."""
    config = (f'gateway_processes = 2\nredis_url = "{redis.url}"\nlog_format = "json"\n'
              f'[[models]]\nname = "stub-model"\nprovisioner = {{ kind = "static", urls = ["{worker_url}"] }}\n')
    server = start_sluice(data_dir, config=config, env={"SLUICE_ADMIN_KEY": ADMIN_KEY})
    deadline = time.monotonic() + 120
    while server.output.count("Sluice gateway listening") < 2:
        if time.monotonic() > deadline or server.process.poll() is not None:
            server.stop()
            raise AssertionError(server.output[-3000:])
        time.sleep(0.2)
    [sibling] = children(server.process.pid)
    return server, sibling


def test_two_processes_share_the_port_the_limits_and_the_ledger(tmp_path, redis, worker_url):
    server, sibling = two_processes(tmp_path / "data", redis, worker_url)
    try:
        admin = {"authorization": f"Bearer {ADMIN_KEY}"}
        teams = httpx.get(f"{server.url}/admin/teams", headers=admin).json()["data"]
        team_id = next(team["id"] for team in teams if team["name"] == "default")
        made = httpx.post(f"{server.url}/admin/keys", headers=admin,
                          json={"name": "shared", "team_id": team_id, "limits": {"rpm": 6}})
        key = {"authorization": f"Bearer {made.json()['key']}"}
        body = {"model": "stub-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        statuses, ids = [], []
        for _ in range(10):  # a connection each: the kernel hands them to either process
            with httpx.Client(base_url=server.url, timeout=30) as client:
                response = client.post("/v1/chat/completions", json=body, headers=key)
            statuses.append(response.status_code)
            ids.append(response.headers["x-request-id"])
        assert sorted(statuses) == [200] * 6 + [429] * 4  # one count of the key's minute across both processes
        assert server.stop() == 0  # as one process does: SIGTERM drains (gateway/cli/draining.py), then exits 0
        assert not os.path.exists(f"/proc/{sibling}")
    finally:
        server.stop()
    with sqlite3.connect(tmp_path / "data" / "sluice.db") as db:
        rows = db.execute("SELECT request_id, status FROM usage_records").fetchall()
    billed = {request_id: status for request_id, status in rows if request_id in ids}
    assert len(billed) == len([r for r, _ in rows if r in ids]) == 10  # each request once
    assert sorted(billed.values()) == ["ok"] * 6 + ["rejected"] * 4


def test_a_process_that_dies_stops_the_others_with_a_failure(tmp_path, redis, worker_url):
    server, sibling = two_processes(tmp_path / "data", redis, worker_url)
    try:
        os.kill(sibling, signal.SIGKILL)
        assert server.wait_exit(timeout=60) == 1
        assert f"gateway process {sibling} exited with status -9; stopping the others" in server.output
    finally:
        server.stop()
