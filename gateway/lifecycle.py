"""The one owner of what the gateway starts beside its requests: background tasks and child processes.

- `Background`: a set of tasks a component started and owns (a controller's drains, the alerts being sent, a batch's
  lines, a worker's stderr relay). `spawn` keeps a reference (a task nobody references may be collected) and logs a
  task that failed; `stop(bound_s)` waits for them up to the bound (or cancels them at once), cancels what is
  left and awaits it: nothing outlives its owner's close.
- `start_process` / `stop_process`: every child process the gateway's event loop starts (a local or standby
  worker). No `preexec_fn`: code between fork and exec is unsafe in a process with threads (the gateway has
  them: uvicorn's, to_thread's), so a child that must die with the gateway asks for that itself at its start
  (common/worker_launch.py `die_with_parent`, told the gateway's pid in `PARENT_PID_ENV`). A stop is SIGTERM,
  then SIGKILL once `bound_s` passed.
- `start_function_process` / `stop_function_process`: a child running a function of ours over a pipe, by `spawn`
  (the render process of large answers: gateway/serving/render_process.py).

`sluice serve`'s sibling gateway processes are started and stopped by gateway/cli/processes.py (a thread of their
own, before any event loop) with the same rules: no `preexec_fn`, SIGTERM then SIGKILL after a bound.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.process
import os
from collections.abc import Callable, Coroutine
from multiprocessing.connection import Connection
from typing import Any

import structlog

from common.worker_launch import PARENT_PID_ENV

log = structlog.get_logger(__name__)
UNWIND_S = 1.0  # what a task still running at the end of a wait gets, once cancelled, to unwind


class Background:
    """Tasks one component owns; `name` says whose in the log."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        """Tasks still running (one just done may wait for its callback to leave the set)."""
        return sum(1 for task in self._tasks if not task.done())

    def spawn(self, work: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background_task_failed", owner=self.name, task=task.get_name(), exc_info=task.exception())

    async def stop(self, bound_s: float, cancel: bool = True) -> None:
        """Every task ended: cancelled at once (`cancel`; they get `bound_s` to unwind), or left to finish for
        `bound_s`, then cancelled (UNWIND_S to unwind). One that swallows its cancellation is left behind, logged."""
        tasks = set(self._tasks)
        if not tasks:
            return
        unwind_s = bound_s
        if not cancel:
            _, tasks = await asyncio.wait(tasks, timeout=bound_s)
            unwind_s = UNWIND_S
        for task in tasks:
            task.cancel()
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=unwind_s)
            if stuck:
                log.error("background_tasks_stuck", owner=self.name, tasks=sorted(t.get_name() for t in stuck))


async def start_process(*command: str, env: dict[str, str], stdin: int | None = None, stdout: int | None = None,
                        stderr: int | None = None) -> asyncio.subprocess.Process:
    """A child process that dies with this one if it reads `PARENT_PID_ENV` (a worker does)."""
    return await asyncio.create_subprocess_exec(*command, env={**env, PARENT_PID_ENV: str(os.getpid())},
                                                stdin=stdin, stdout=stdout, stderr=stderr)


async def stop_process(process: asyncio.subprocess.Process, bound_s: float) -> int:
    """SIGTERM, and SIGKILL if it has not exited after `bound_s`: its exit status."""
    if process.returncode is None:
        process.terminate()
    try:
        return await asyncio.wait_for(process.wait(), bound_s)
    except TimeoutError:
        log.warning("process_killed", pid=process.pid, bound_s=bound_s)
        process.kill()
        return await process.wait()


def start_function_process(target: Callable[[Connection], None],
                           name: str) -> tuple[Connection, multiprocessing.process.BaseProcess]:
    """A child running `target` with its end of a pipe; this process keeps the other. Started by `spawn` (a fork
    of a process with threads and an event loop is unsafe); a daemon, ended at this process's exit, and a child
    whose pipe closes (this process gone, even killed) should return from `target`."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=target, args=(theirs,), name=name, daemon=True)
    child.start()
    theirs.close()
    return ours, child


def stop_function_process(child: multiprocessing.process.BaseProcess, bound_s: float) -> None:
    """Wait `bound_s` for the child to end (its pipe closed first), then kill it."""
    child.join(bound_s)
    if child.is_alive():
        log.warning("process_killed", pid=child.pid, bound_s=bound_s)
        child.kill()
        child.join()
