"""No usage is lost when ECS stops or replaces a gateway task (whose own disk dies with it).

1. SIGTERM to a real `sluice serve` under load (concurrent clients, PostgreSQL ledger, WAL on a shared root as on ECS):
   once the process has exited, PostgreSQL holds every request that got a response, and the WAL
   root is empty, so nothing waited on a disk that is about to vanish.
2. A gateway killed outright leaves its log on the shared volume (EFS); a live gateway adopts it,
   ships every acknowledged record to PostgreSQL and removes it, and never touches a live one's.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from billing.pricing import PricingTable
from billing.records import Price
from billing.store import open_store
from billing.wal_home import WalHome, adopt_orphans
from testkit.databases import create_database
from testkit.sluice import MODEL, REPO, standalone_worker, start_sluice

ADMIN_KEY = "durability-admin-key-0123456789abcdef"
CLIENTS = 4


async def stored(database_url: str, ids: list[str]) -> dict[str, int]:
    store = await open_store(database_url)
    try:
        return await store.count(ids)
    finally:
        await store.close()


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    with standalone_worker(tmp_path_factory.mktemp("worker"), max_batch_size=32) as url:
        yield url


@pytest.mark.slow
async def test_sigterm_under_load_loses_no_answered_request(postgres, worker, tmp_path):
    database_url = await create_database(postgres.url)
    wal_root = tmp_path / "efs"
    config = (f'database_url = "{database_url}"\n[[models]]\nname = "{MODEL}"\n'
              f'provisioner = {{ kind = "static", urls = ["{worker}"] }}\n')
    server = start_sluice(tmp_path / "gateway", config=config,
                          env={"SLUICE_ADMIN_KEY": ADMIN_KEY, "SLUICE_WAL_ROOT": str(wal_root),
                               # as on ECS (stop timeout minus the drain): requests in flight finish
                               "SLUICE_SHUTDOWN_GRACE_SECONDS": "100"})
    key = server.api_key
    answered: list[str] = []
    other: list[str] = []
    refused = 0
    stopping, stop = asyncio.Event(), asyncio.Event()

    async def client(http: httpx.AsyncClient, index: int) -> None:
        nonlocal refused
        while not stop.is_set():
            body = {"model": MODEL, "prompt": f"Client {index} says", "max_tokens": 3, "temperature": 0}
            try:
                response = await http.post("/v1/completions", json=body, headers={"authorization": f"Bearer {key}"})
            except httpx.TransportError as error:
                if not stopping.is_set():
                    other.append(repr(error))
                refused += 1  # the listener closed: the gateway is going away
                await asyncio.sleep(0.05)
                continue
            if response.status_code == 200:
                assert response.json()["usage"]["completion_tokens"] > 0
                answered.append(response.headers["x-request-id"])
            elif stopping.is_set() and response.status_code == 503:  # draining: it answers, and says so
                assert response.json()["error"]["endpoint_state"] == "draining", response.text
                refused += 1
                await asyncio.sleep(0.05)
            else:
                other.append(f"{response.status_code} {response.text[:200]}")

    # a bound against hangs only: on a shared 2-core machine one request can take 10 s
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as http:
        clients = [asyncio.create_task(client(http, i)) for i in range(CLIENTS)]
        deadline = time.monotonic() + 600
        while len(answered) < 3 * CLIENTS:  # under load: requests in flight at every moment
            assert time.monotonic() < deadline and not other, (len(answered), other[:3], server.output[-2000:])
            for task in clients:
                if task.done():
                    task.result()  # a client that failed says why
            await asyncio.sleep(0.1)
        stopping.set()
        server.process.send_signal(signal.SIGTERM)
        exit_code = await asyncio.to_thread(server.process.wait, 120)
        stop.set()
        await asyncio.gather(*clients)

    # uvicorn re-raises the SIGTERM it caught once shutdown is complete; the lifespan closed everything first
    assert exit_code in (0, -signal.SIGTERM) and '"gateway_stopped"' in server.output, (exit_code,
                                                                                      server.output[-3000:])
    assert refused > 0  # the clients were still sending when it stopped
    counts = await stored(database_url, answered)
    missing = [rid for rid, count in counts.items() if count != 1]
    assert not missing, f"{len(missing)} answered requests are not in PostgreSQL: {missing[:5]}"
    assert list(wal_root.iterdir()) == [], "the WAL root must be empty: the task's disk is about to vanish"


def _start_owner(wal_root: Path, database_url: str) -> tuple[subprocess.Popen, list[str], threading.Event]:
    process = subprocess.Popen([sys.executable, "-m", "tests.infra.wal_owner", str(wal_root), database_url],
                               cwd=REPO, stdout=subprocess.PIPE, text=True, bufsize=1)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        for line in process.stdout:
            lines.append(line.strip())
            if len(lines) > 200:
                ready.set()

    threading.Thread(target=pump, daemon=True).start()
    return process, lines, ready


@pytest.mark.slow
async def test_a_killed_gateways_log_is_adopted_and_a_live_ones_is_left_alone(postgres, tmp_path):
    """The owners write to their own SQLite ledgers: whatever reaches PostgreSQL came from the adoption."""
    database_url = await create_database(postgres.url)
    wal_root = tmp_path / "efs"
    dead, dead_lines, dead_ready = _start_owner(wal_root, f"sqlite:///{tmp_path / 'dead.db'}")
    alive, alive_lines, alive_ready = _start_owner(wal_root, f"sqlite:///{tmp_path / 'alive.db'}")
    try:
        assert await asyncio.to_thread(dead_ready.wait, 120) and await asyncio.to_thread(alive_ready.wait, 120)
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=30)
        time.sleep(0.2)  # the pump thread reads what was in the pipe at the kill
        acknowledged = [line for line in dead_lines if line.startswith("owner-")]
        dead_home = dead_lines[0].removeprefix("home ")
        alive_home = alive_lines[0].removeprefix("home ")

        me = WalHome.claim(wal_root, str(wal_root))
        try:
            adopted = await adopt_orphans(me, database_url, PricingTable.static({"small": Price(100_000, 400_000)}))
        finally:
            me.release()
        assert adopted == [dead_home]
        counts = await stored(database_url, acknowledged)
        assert len(acknowledged) >= 200 and all(count == 1 for count in counts.values())
        assert not (wal_root / dead_home).exists() and not (wal_root / f"{dead_home}.lock").exists()
        assert (wal_root / alive_home).is_dir() and alive.poll() is None
        alive_ids = [line for line in alive_lines if line.startswith("owner-")]
        assert set((await stored(database_url, alive_ids[:50])).values()) == {0}  # untouched
    finally:
        for process in (dead, alive):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_a_fresh_instance_never_shares_a_directory(tmp_path):
    first, second = WalHome.claim(tmp_path, str(tmp_path)), WalHome.claim(tmp_path, str(tmp_path))
    try:
        assert first.path != second.path and first.path.parent == second.path.parent == tmp_path
    finally:
        first.release()
        second.release()
    assert os.listdir(tmp_path) == []  # nothing was written: both leave nothing behind


def test_without_a_shared_root_the_log_stays_in_the_data_dir(tmp_path):
    home = WalHome.claim(tmp_path, "")
    assert home.path == tmp_path / "billing-wal" and home.root is None
    home.release()
