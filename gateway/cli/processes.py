"""`gateway_processes`: several `sluice serve` processes accepting on one listening socket, one per core.

The first process binds the port (so a taken port still fails at once), starts serving, and once its start-up
is over (migrations run, the first keys made) starts the others with the same command line, handing them the
socket. Each is a whole gateway with its own event loop; what they must agree on lives outside them: the
database, the limits in Redis (`check_processes` refuses more than one process without `redis_url`), and each
its own usage log under a shared WAL root (billing/wal_home.py: a log whose process died is adopted by a live
one). The first process is the supervisor: SIGTERM to it stops the others too, and any of them exiting on its
own stops the lot with a failure.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from billing.wal import list_segments
from common.worker_launch import die_with_parent
from gateway.config import Settings

LISTEN_FD_ENV = "SLUICE_LISTEN_FD"  # set in the processes the first one starts: the socket they inherit
PARENT_ENV = "SLUICE_FIRST_GATEWAY_PID"
SHARED_WAL = "billing-wal-processes"
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def inherited_socket() -> socket.socket | None:
    """The listening socket this process was handed by the first gateway process, if it was. Such a process
    ends when the first one does, even by SIGKILL (`die_with_parent`: set here rather than between fork and exec,
    which is unsafe in a process with threads)."""
    fd = os.environ.pop(LISTEN_FD_ENV, None)
    if not fd:
        return None
    die_with_parent(PARENT_ENV)
    return socket.socket(fileno=int(fd))


def shared_wal_root(settings: Settings) -> str:
    """Where the processes keep their usage logs: `wal_root` when given, else a directory in the data dir.
    Refuses (ValueError) to leave records of an earlier single-process run behind unshipped."""
    if settings.wal_root:
        return settings.wal_root
    single = settings.data_path / "billing-wal"
    if single.exists() and list_segments(single):
        raise ValueError(f"the usage log {single} of a single-process run still holds records: start once with "
                         "gateway_processes = 1 to ship them")
    return str(settings.data_path / SHARED_WAL)


class Siblings:
    """The other gateway processes, started by the first once it serves, and watched by it."""

    def __init__(self, sock: socket.socket, argv: list[str], count: int, fail: Callable[[str], None]) -> None:
        self.sock, self.argv, self.count, self.fail = sock, argv, count, fail
        self.processes: list[subprocess.Popen] = []
        self.stopping = False
        self._lock = threading.Lock()

    def start_when(self, ready: Callable[[], bool]) -> None:
        # one thread starts and watches them all, and outlives them: PR_SET_PDEATHSIG fires when the *thread*
        # that started a process ends
        threading.Thread(target=self._run, args=(ready,), name="gateway-siblings", daemon=True).start()

    def _run(self, ready: Callable[[], bool]) -> None:
        while not ready():
            if self.stopping:
                return
            time.sleep(0.05)
        env = {**os.environ, LISTEN_FD_ENV: str(self.sock.fileno()), PARENT_ENV: str(os.getpid())}
        for _ in range(self.count):
            with self._lock:
                if self.stopping:
                    break
                self.processes.append(subprocess.Popen(
                    [sys.executable, "-m", "gateway.cli.main", *self.argv], env=env, pass_fds=(self.sock.fileno(),),
                    cwd=Path.cwd()))
        reported = False
        while True:
            running = [process for process in self.processes if process.poll() is None]
            if len(running) < len(self.processes) and not self.stopping and not reported:
                reported = True
                ended = next(process for process in self.processes if process.returncode is not None)
                self.fail(f"gateway process {ended.pid} exited with status {ended.returncode}; stopping the others")
            if not running:
                return
            time.sleep(0.1)

    @contextlib.contextmanager
    def signals_held(self) -> Iterator[None]:
        """uvicorn re-raises the SIGTERM it stopped on once it is done, which would end this process before the
        others: held here until they are down, then raised the same way."""
        held: list[int] = []
        previous = {sig: signal.signal(sig, lambda number, _frame: held.append(number)) for sig in SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        for sig in reversed(held):
            signal.raise_signal(sig)

    def stop(self, timeout: float) -> int:
        """SIGTERM to each (they finish their requests like the first one); the worst exit status."""
        with self._lock:
            self.stopping = True
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        worst = 0
        for process in self.processes:
            try:
                code = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
            worst = worst or max(0, code)
        return worst
