"""The real `sluice serve` (its own process, SQLite auth and ledger in a temporary data dir) in front of the
protocol stub worker (tests/faults/stub_worker.py), for security tests about the gateway: no model loads.
`sign_in` opens a dashboard session for a key, as a browser's form would."""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.fixtures.servers import free_port, wait_for_port
from tests.fixtures.sluice import REPO, SluiceServer, running_sluice

MODEL = "stub-model"


@contextlib.contextmanager
def stub_served(data_dir: Path, admin_key: str, config: str = "") -> Iterator[SluiceServer]:
    port = free_port()
    worker = subprocess.Popen([sys.executable, "-m", "tests.faults.stub_worker", "--port", str(port),
                               "--model", MODEL, "--token-delay", "0"], cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port)
        config = (f'{config}\n[[models]]\nname = "{MODEL}"\n'
                  f'provisioner = {{ kind = "static", urls = ["http://127.0.0.1:{port}"] }}\n')
        with running_sluice(data_dir, config=config, env={"SLUICE_ADMIN_KEY": admin_key}) as server:
            yield server
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


@contextlib.contextmanager
def sign_in(url: str, key: str) -> Iterator[httpx.Client]:
    """A client holding a signed-in dashboard session of `key`."""
    with httpx.Client(base_url=url, timeout=30) as client:
        signed = client.post("/dashboard/login", data={"csrf": csrf_of(client.get("/dashboard/login").text),
                                                       "api_key": key})
        assert signed.status_code == 303, signed.text[:500]
        yield client
