"""A real `sluice serve` in front of a protocol-playing stub worker (tests/faults/stub_worker.py), and the
readings the load and fault tests take from them: the gateway's memory and descriptors, the ledger's records,
the stub's row books."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from tests.faults.load import MODEL
from tests.fixtures.servers import free_port
from tests.fixtures.sluice import REPO, SluiceServer, running_sluice, wait_for_health

ADMIN_KEY = "faults-test-admin-key-0123456789abcdef"


@dataclass
class Stub:
    url: str
    process: subprocess.Popen

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/stats", timeout=10).json()


@contextlib.contextmanager
def stub_worker(token_delay: float = 0.01, token_bytes: int = 4) -> Iterator[Stub]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "tests.faults.stub_worker", "--port", str(port), "--model", MODEL,
                                "--token-delay", str(token_delay), "--token-bytes", str(token_bytes)], cwd=REPO)
    stub = Stub(f"http://127.0.0.1:{port}", process)
    try:
        wait_for_health(process, stub.url, 60, "the stub worker")
        yield stub
    finally:
        process.terminate()
        process.wait(timeout=20)


def gateway_config(stub: Stub, extra: str = "") -> str:
    # no limits on the default team: the load sends more streams at once than its shipped max_concurrency (64);
    # and no cap on connections per address: the load clients are one address standing for many clients
    return (f'{extra}\nlog_format = "json"\ndefault_team_limits = {{}}\nhttp = {{ max_connections_per_client = 0 }}\n'
            f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{stub.url}"] }}\n')


@contextlib.contextmanager
def gateway(data_dir: Path, stub: Stub, extra: str = "", env: dict[str, str] | None = None) -> Iterator[SluiceServer]:
    with running_sluice(data_dir, config=gateway_config(stub, extra),
                        env={"SLUICE_ADMIN_KEY": ADMIN_KEY, **(env or {})}) as server:
        yield server


def host_port(server: SluiceServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def footprint(server: SluiceServer) -> tuple[int, int]:
    """(resident bytes, open file descriptors) of the gateway process."""
    process = psutil.Process(server.process.pid)
    return process.memory_info().rss, process.num_fds()


def admin_get(server: SluiceServer, path: str, **params) -> httpx.Response:
    return httpx.get(f"{server.url}{path}", params=params, timeout=60,
                     headers={"authorization": f"Bearer {ADMIN_KEY}"})


def ledger_records(server: SluiceServer) -> list[dict]:
    """Every record of the ledger, page after page where the records API pages."""
    records: list[dict] = []
    cursor = None
    while True:
        params = {"start": "2000-01-01", "end": "2100-01-01"}
        if cursor:
            params["cursor"] = cursor
        response = admin_get(server, "/admin/usage/records", **params)
        assert response.status_code == 200, response.text
        body = response.json()
        records.extend(body["data"])
        cursor = body.get("next_cursor")
        if not cursor:
            return records


def wait_for_records(server: SluiceServer, count: int, timeout: float = 60.0) -> list[dict]:
    """The ledger's records once it holds at least `count` (the shipper moves them from the WAL in batches)."""
    deadline = time.monotonic() + timeout
    while True:
        records = ledger_records(server)
        if len(records) >= count or time.monotonic() > deadline:
            return records
        time.sleep(0.3)


def create_key(server: SluiceServer, name: str, **limits) -> str:
    """A new service key of the default team with these limits; its clear value."""
    teams = admin_get(server, "/admin/teams").json()["data"]
    team_id = next(t["id"] for t in teams if t["name"] == "default")
    response = httpx.post(f"{server.url}/admin/keys", json={"name": name, "team_id": team_id, "limits": limits},
                          timeout=30,
                          headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert response.status_code == 201, response.text
    return response.json()["key"]


def fire_completions(server: SluiceServer, key: str, count: int) -> list[int]:
    """`count` non-streamed completions one after another; their statuses."""
    return [httpx.post(f"{server.url}/v1/completions", timeout=30, headers={"authorization": f"Bearer {key}"},
                       json={"model": MODEL, "prompt": "hi", "max_tokens": 4}).status_code for _ in range(count)]
