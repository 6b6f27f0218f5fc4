"""Local worker processes: started per configured model, restarted when they die, stopped with us.

Each worker gets PR_SET_PDEATHSIG, so even a gateway killed with SIGKILL leaves no orphan behind.
"""

from __future__ import annotations

import asyncio
import ctypes
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import msgspec
import structlog

from common.protocol import ModelConfig
from gateway.routing.worker_trust import worker_environment, worker_secret

log = structlog.get_logger(__name__)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass(eq=False)
class LocalWorker:
    model: ModelConfig
    port: int
    worker_id: str
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Supervisor:
    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.workers: list[LocalWorker] = []
        self._watchers: list[asyncio.Task] = []
        self._stopping = False

    def add(self, model: ModelConfig, index: int) -> LocalWorker:
        worker = LocalWorker(model, free_port(), f"{model.name.split('/')[-1]}-{index}")
        self.workers.append(worker)
        return worker

    async def start(self) -> None:
        for worker in self.workers:
            await self._spawn(worker)
            self._watchers.append(asyncio.create_task(self._watch(worker)))

    async def _spawn(self, worker: LocalWorker) -> None:
        command = [sys.executable, "-m", "worker", "--model-json", msgspec.json.encode(worker.model).decode(),
                   "--port", str(worker.port), "--data-dir", str(self.data_dir), "--worker-id", worker.worker_id]
        worker.process = await asyncio.create_subprocess_exec(*command, preexec_fn=_die_with_parent,
                                                              env=worker_environment(worker_secret()))
        log.info("worker_started", worker_id=worker.worker_id, pid=worker.process.pid, port=worker.port)

    async def _watch(self, worker: LocalWorker) -> None:
        while not self._stopping:
            code = await worker.process.wait()
            if self._stopping:
                return
            worker.restarts += 1
            delay = min(30.0, 0.5 * 2 ** min(worker.restarts - 1, 6))
            log.warning("worker_exited", worker_id=worker.worker_id, code=code, restart_in=delay)
            await asyncio.sleep(delay)
            if not self._stopping:
                await self._spawn(worker)

    async def stop(self) -> None:
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        for worker in self.workers:
            if worker.process and worker.process.returncode is None:
                worker.process.terminate()
        for worker in self.workers:
            if worker.process and worker.process.returncode is None:
                try:
                    await asyncio.wait_for(worker.process.wait(), timeout=15)
                except TimeoutError:
                    worker.process.kill()
                    await worker.process.wait()
