"""One owner of the gateway's processes and background tasks (issue #46, item 3): gateway/lifecycle.py.

The review found five places owning process lifecycle, one of them forking with `preexec_fn` in the threaded
gateway. The scans fail when a `preexec_fn`, a child process or a long-lived task appears outside the owner; the
rest proves the owner's promises on real tasks and real processes: a stop ends every task and process it owns
within its bound, and a worker dies with the process that started it without code between fork and exec.
"""

from __future__ import annotations

import ast
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from common.worker_launch import PARENT_PID_ENV
from gateway import lifecycle
from gateway.lifecycle import Background, start_process, stop_process
from tests.logged import logged

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "gateway"
# tasks a request awaits before it answers (never outliving it), and the two loops with stop rules of their own
REQUEST_SCOPED = {
    "limits/budget_model.py",  # a budget's first read, shared by the requests that wait for it
    "edge/write_timeout.py",  # a body read raced against a stalled write
    "serving/client_gone.py",  # a wait raced against the client's leaving
    "serving/collect.py",  # the choices of one collected answer
    "serving/health_probe.py",  # the one probe the /health_generate callers wait for together
    "endpoints/controller.py",  # its loop: a cancel repeated until it ends, within LOOP_STOP_S (`_stop_loop`)
    "cli/draining.py",  # the drain a SIGTERM starts, which ends the server
}


def _calls(root: Path, matches) -> dict[str, set[str]]:
    """Modules under `root` -> the dotted names of their calls that `matches`."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                parts, func = [], node.func
                while isinstance(func, ast.Attribute):
                    parts.append(func.attr)
                    func = func.value
                parts.append(getattr(func, "id", ""))
                name = ".".join(reversed(parts))
                if matches(name):
                    found.setdefault(str(path.relative_to(root)), set()).add(name)
    return found


def _starts_a_process(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return (last in {"create_subprocess_exec", "create_subprocess_shell", "Popen", "ProcessPoolExecutor", "fork",
                     "forkpty", "Process"} or name.startswith(("subprocess.", "os.spawn", "os.exec", "os.posix_spawn")))


def test_no_preexec_fn_remains():
    """Code between fork and exec is unsafe in a process with threads: nothing of ours runs any."""
    for package in ("gateway", "worker", "common", "billing", "auth", "storage"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call):
                    assert not any(k.arg == "preexec_fn" for k in node.keywords), f"preexec_fn in {path}"


def test_child_processes_and_tasks_are_started_by_the_owner():
    processes = _calls(GATEWAY, _starts_a_process)
    # the sibling gateway processes of `sluice serve` start before any event loop, from a thread of their own
    assert set(processes) <= {"lifecycle.py", "cli/processes.py"}, processes
    tasks = set(_calls(GATEWAY, lambda name: name.endswith((".create_task", ".ensure_future"))))
    assert tasks - REQUEST_SCOPED == {"lifecycle.py"}, tasks - REQUEST_SCOPED


async def test_a_stop_cancels_every_task_within_its_bound(monkeypatch):
    events = logged(monkeypatch, lifecycle)
    owned = Background("test")
    started = asyncio.Event()
    cleaned = []

    async def forever() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cleaned.append("forever")

    async def stubborn() -> None:  # swallows its first cancellation: the stop must still return
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.Event().wait()

    tasks = [owned.spawn(forever(), name="forever"), owned.spawn(stubborn(), name="stubborn")]
    await started.wait()
    assert len(owned) == 2
    await owned.stop(0.2)
    assert tasks[0].cancelled() and cleaned == ["forever"]
    assert not tasks[1].done()  # left behind, and said so
    assert any(e["event"] == "background_tasks_stuck" and e["tasks"] == ["stubborn"] for e in events)
    tasks[1].cancel()
    with pytest.raises(asyncio.CancelledError):
        await tasks[1]
    assert len(owned) == 0


async def test_a_stop_that_waits_lets_tasks_finish_then_cancels_the_rest():
    owned = Background("test")
    finishing = owned.spawn(asyncio.sleep(0, result="sent"))
    hanging = owned.spawn(asyncio.Event().wait())
    await owned.stop(0.2, cancel=False)
    assert finishing.result() == "sent" and hanging.cancelled() and not owned


async def test_a_failed_task_is_logged(monkeypatch):
    events = logged(monkeypatch, lifecycle)
    owned = Background("test")

    async def fails() -> None:
        raise RuntimeError("broken")

    task = owned.spawn(fails(), name="fails")
    await asyncio.wait([task])
    await asyncio.sleep(0)  # its done callback
    assert [(e["event"], e["owner"], e["task"]) for e in events] == [("background_task_failed", "test", "fails")]


SLEEPER = "import signal, sys, time\n{ignore}print('up', flush=True)\ntime.sleep(600)\n"


@pytest.mark.parametrize("ignores_sigterm", [False, True])
async def test_a_process_stops_within_its_bound(ignores_sigterm):
    ignore = "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignores_sigterm else ""
    process = await start_process(sys.executable, "-c", SLEEPER.format(ignore=ignore), env=dict(os.environ),
                                  stdout=asyncio.subprocess.PIPE)
    assert await process.stdout.readline() == b"up\n"  # its handler is in place
    code = await stop_process(process, 0.5)
    assert code == (-signal.SIGKILL if ignores_sigterm else -signal.SIGTERM)


GRANDCHILD = ("from common.worker_launch import die_with_parent\nimport os, time\ndie_with_parent()\n"
              "print(os.getpid(), flush=True)\ntime.sleep(600)\n")
PARENT = ("import os, subprocess, sys\n"
          f"subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}], env={{**os.environ, {PARENT_PID_ENV!r}: "
          "str(os.getpid())}, stdout=sys.stdout)\n"
          "import time; time.sleep(600)\n")


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
async def test_a_child_dies_with_its_parent_even_by_sigkill():
    """What a local worker does at its start (worker/__main__.py): no orphan, without a preexec_fn."""
    parent = await asyncio.create_subprocess_exec(sys.executable, "-c", PARENT, stdout=asyncio.subprocess.PIPE,
                                                  cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        child = int(await asyncio.wait_for(parent.stdout.readline(), 60))
        assert _alive(child)
    finally:
        parent.kill()
        await parent.wait()
    deadline = time.monotonic() + 120  # a bound on the wait, not a timing: it ends as soon as the child is gone
    while _alive(child) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not _alive(child)
