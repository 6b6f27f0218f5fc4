"""One local `python -m worker` process: started with the model's config on a free port, dying with
the gateway (even a gateway killed with SIGKILL leaves no orphan: the worker asks for it at its start,
common/worker_launch.py), its stderr passed through to ours with the last line kept (why it exited, when it
does). Started, its stderr relayed and stopped through gateway/lifecycle.py, the owner of the gateway's
processes and background tasks.

A standby process (`spawn_standby`) imports everything and waits; `assign` gives it its model and port
(common/worker_launch.py)."""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import structlog

from common.protocol import ModelConfig
from common.worker_launch import MODEL_LOAD_FAILED_EXIT, Assignment
from common.worker_settings import WorkerSettings, arguments, environment
from gateway.lifecycle import Background, start_process, stop_process
from gateway.replicas.trust import worker_environment, worker_secret

log = structlog.get_logger(__name__)
STOP_TIMEOUT_S = 15.0
LAST_LINE_LIMIT = 500
TAIL_BYTES = 8192
RELAY_END_S = 5.0  # the stderr left in the pipe of an exited worker: read to its end within this


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def worker_command(model: ModelConfig, port: int, data_dir: Path, worker_id: str) -> list[str]:
    settings = WorkerSettings(model=model, port=port, data_dir=str(data_dir), worker_id=worker_id)
    return [sys.executable, "-m", "worker", *arguments(settings)]


def worker_env() -> dict[str, str]:
    """The allow-listed environment (trust.py) and what this gateway decides for the worker: the worker secret
    and when it was spawned (common/worker_settings.py)."""
    decided = WorkerSettings(worker_secret=worker_secret(), spawned_at=time.time())
    return {**worker_environment(decided.worker_secret), **environment(decided)}


@dataclass(eq=False)
class WorkerProcess:
    worker_id: str
    port: int
    process: asyncio.subprocess.Process
    started_at: float = field(default_factory=time.monotonic)
    _tail: bytes = b""  # the end of what it wrote to stderr
    _relay: Background = field(default_factory=lambda: Background("worker stderr"))

    @classmethod
    async def spawn(cls, model: ModelConfig, data_dir: Path, worker_id: str, port: int | None = None) -> WorkerProcess:
        port = port or free_port()
        worker = await cls._launch(worker_command(model, port, data_dir, worker_id), worker_id, port)
        log.info("worker_started", worker_id=worker_id, pid=worker.pid, port=port, model=model.name)
        return worker

    @classmethod
    async def spawn_standby(cls) -> WorkerProcess:
        """A worker that imports everything, then waits for `assign`."""
        worker = await cls._launch([sys.executable, "-m", "worker", "--standby"], "standby", 0,
                                   stdin=asyncio.subprocess.PIPE)
        log.info("worker_standby", pid=worker.pid)
        return worker

    async def assign(self, model: ModelConfig, data_dir: Path, worker_id: str, port: int | None = None) -> None:
        self.worker_id, self.port = worker_id, port or free_port()
        self.started_at = time.monotonic()
        job = Assignment(model=model, port=self.port, worker_id=worker_id, data_dir=str(data_dir),
                         assigned_at=time.time())
        self.process.stdin.write(msgspec.json.encode(job) + b"\n")
        await self.process.stdin.drain()
        self.process.stdin.close()
        log.info("worker_started", worker_id=worker_id, pid=self.pid, port=self.port, model=model.name, standby=True)

    @classmethod
    async def _launch(cls, command: list[str], worker_id: str, port: int, stdin=None) -> WorkerProcess:
        process = await start_process(*command, env=worker_env(), stdin=stdin, stderr=asyncio.subprocess.PIPE)
        worker = cls(worker_id, port, process)
        worker._relay.spawn(worker._pass_stderr(), name=f"stderr of worker {process.pid}")
        return worker

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    @property
    def last_line(self) -> str:
        lines = [line.strip() for line in self._tail.decode(errors="replace").splitlines() if line.strip()]
        return lines[-1][:LAST_LINE_LIMIT] if lines else ""

    @property
    def load_failed(self) -> bool:
        return self.process.returncode == MODEL_LOAD_FAILED_EXIT

    async def wait(self) -> int:
        """The exit code, once the process has exited and its last line is read."""
        code = await self.process.wait()
        await self._relay.stop(RELAY_END_S, cancel=False)  # its pipe's end is near: the process has exited
        return code

    async def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM (the worker finishes nothing: drain before calling this), SIGKILL after `timeout`."""
        await stop_process(self.process, timeout)
        return await self.wait()

    async def _pass_stderr(self) -> None:
        # chunks, not lines: one endless line must not stall the relay (and the worker behind a full pipe)
        while chunk := await self.process.stderr.read(1 << 16):
            _write_stderr(chunk)
            self._tail = (self._tail + chunk)[-TAIL_BYTES:]


def _write_stderr(data: bytes) -> None:
    binary = getattr(sys.stderr, "buffer", None)
    if binary is not None:
        binary.write(data)
    else:  # a text-only stream (a test's capture)
        sys.stderr.write(data.decode(errors="replace"))
    sys.stderr.flush()
