"""Local worker processes: started per configured model, restarted when they die, stopped with us.

A worker whose model cannot load (common/worker_launch.py) is not restarted: when it serves the only
configured model, the gateway stops with that worker's one line as its reason (gateway/shutdown.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from common.protocol import ModelConfig
from gateway import shutdown
from gateway.routing.worker_process import WorkerProcess, free_port

log = structlog.get_logger(__name__)


@dataclass(eq=False)
class LocalWorker:
    model: ModelConfig
    port: int
    worker_id: str
    process: WorkerProcess | None = None
    restarts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Supervisor:
    def __init__(self, data_dir: Path, on_fatal: Callable[[str], None] = shutdown.fail):
        self.data_dir = data_dir
        self.on_fatal = on_fatal
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
        worker.process = await WorkerProcess.spawn(worker.model, self.data_dir, worker.worker_id, worker.port)

    async def _watch(self, worker: LocalWorker) -> None:
        while not self._stopping:
            code = await worker.process.wait()
            if self._stopping:
                return
            if worker.process.load_failed:
                self._unloadable(worker)
                return
            worker.restarts += 1
            delay = min(30.0, 0.5 * 2 ** min(worker.restarts - 1, 6))
            log.warning("worker_exited", worker_id=worker.worker_id, code=code, restart_in=delay)
            await asyncio.sleep(delay)
            if not self._stopping:
                await self._spawn(worker)

    def _unloadable(self, worker: LocalWorker) -> None:
        """Starting it again cannot help. With one model there is nothing left to serve: stop the gateway."""
        reason = worker.process.last_line
        log.error("worker_model_unloadable", worker_id=worker.worker_id, model=worker.model.name, reason=reason)
        if len({w.model.name for w in self.workers}) == 1:
            self.on_fatal(reason.removeprefix("sluice worker: "))

    async def stop(self) -> None:
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*(worker.process.stop() for worker in self.workers if worker.process))
