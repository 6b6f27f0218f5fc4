"""A real `sluice serve` in front of a protocol worker process (testkit/protocol_worker.py, counted replies), set
up for load (no team limits, no cap on connections per address), and the readings the load and fault tests take
from the gateway: its address, memory and open descriptors."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil

from testkit.protocol_worker import MODEL, WorkerProcess
from testkit.sluice import SluiceServer, running_sluice

ADMIN_KEY = "faults-test-admin-key-0123456789abcdef"


def stub_gateway_config(worker: WorkerProcess, extra: str = "") -> str:
    # no limits on the default team: the load sends more streams at once than its shipped max_concurrency (64);
    # and no cap on connections per address: the load clients are one address standing for many clients
    return (f'{extra}\nlog_format = "json"\ndefault_team_limits = {{}}\nhttp = {{ max_connections_per_client = 0 }}\n'
            f'[[models]]\nname = "{MODEL}"\nprovisioner = {{ kind = "static", urls = ["{worker.url}"] }}\n')


@contextlib.contextmanager
def sluice_on_worker_process(data_dir: Path, worker: WorkerProcess, extra: str = "",
                             env: dict[str, str] | None = None) -> Iterator[SluiceServer]:
    """`sluice serve` whose one endpoint, MODEL, is `worker`; admin key ADMIN_KEY. `extra`: top-level TOML."""
    with running_sluice(data_dir, config=stub_gateway_config(worker, extra),
                        env={"SLUICE_ADMIN_KEY": ADMIN_KEY, **(env or {})}) as server:
        yield server


def host_port(server: SluiceServer) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").split(":")
    return host, int(port)


def footprint(server: SluiceServer) -> tuple[int, int]:
    """(resident bytes, open file descriptors) of the gateway process."""
    process = psutil.Process(server.process.pid)
    return process.memory_info().rss, process.num_fds()


def fire_completions(server: SluiceServer, key: str, count: int) -> list[int]:
    """`count` non-streamed completions one after another; their statuses."""
    return [httpx.post(f"{server.url}/v1/completions", timeout=30, headers={"authorization": f"Bearer {key}"},
                       json={"model": MODEL, "prompt": "hi", "max_tokens": 4}).status_code for _ in range(count)]
