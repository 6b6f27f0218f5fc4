"""Worker processes on this machine (`python -m worker`), started and stopped on demand.

Each replica is one process on a free port, dying with the gateway (gateway/endpoints/provisioners/worker_process.py):
the standby spare when there is one (already imported: standby.py), a new process otherwise.
A process that exits is reported once by `observe`, with its last stderr line; the controller decides
whether to start another (crash loop and load failures make the endpoint `failed` instead).
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from common.protocol import ModelConfig
from gateway.endpoints.provisioners.base import Observation, Provisioner, ReplicaAddress, ReplicaExit
from gateway.endpoints.provisioners.standby import StandbyWorkers
from gateway.endpoints.provisioners.worker_process import WorkerProcess


class LocalProvisioner(Provisioner):
    def __init__(self, model: ModelConfig, data_dir: Path, standby: StandbyWorkers | None = None):
        self.model = model
        self.data_dir = data_dir
        self.standby = standby
        self._processes: dict[str, WorkerProcess] = {}
        self._numbers = itertools.count()

    @property
    def processes(self) -> list[WorkerProcess]:
        return list(self._processes.values())

    async def observe(self) -> Observation:
        exits = []
        for replica_id, process in list(self._processes.items()):
            if process.returncode is not None:
                await process.wait()  # its last line is read
                del self._processes[replica_id]
                exits.append(ReplicaExit(replica_id, process.last_line or f"exit code {process.returncode}",
                                         load_failed=process.load_failed))
        replicas = [ReplicaAddress(replica_id, process.url) for replica_id, process in self._processes.items()]
        return Observation(replicas, exits)

    async def add(self, count: int, *, target: int | None = None) -> None:
        short = self.model.name.rsplit("/", 1)[-1]
        for _ in range(count):
            replica_id = f"{short}-{next(self._numbers)}"
            spare = self.standby.take() if self.standby is not None else None
            if spare is not None:
                await spare.assign(self.model, self.data_dir, replica_id)
                self._processes[replica_id] = spare
            else:
                self._processes[replica_id] = await WorkerProcess.spawn(self.model, self.data_dir, replica_id)

    async def remove(self, replica_id: str) -> None:
        process = self._processes.pop(replica_id, None)
        if process is not None:
            await process.stop()

    async def close(self) -> None:
        processes, self._processes = list(self._processes.values()), {}
        await asyncio.gather(*(process.stop() for process in processes))
