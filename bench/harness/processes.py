"""The processes the gateway bench starts (stubs, LiteLLM in its own venv) and the CPU they spend."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
BENCH_HOME = REPO / ".bench"
LITELLM_PIN = "litellm[proxy]==1.106.*"
LITELLM_VENV = BENCH_HOME / "litellm"
TICKS = os.sysconf("SC_CLK_TCK")


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found:
        return found
    if os.geteuid() != 0:
        raise SystemExit("bench: wrk is missing; install it with `apt-get install -y wrk`")
    subprocess.run(["apt-get", "install", "-y", "-qq", "wrk"], check=True, stdout=subprocess.DEVNULL)
    return shutil.which("wrk") or "wrk"


def ensure_litellm() -> Path:
    """LiteLLM pinned, in its own venv (its pins clash with ours); created on first use."""
    python = LITELLM_VENV / "bin" / "python"
    stamp = LITELLM_VENV / ".installed"
    if not stamp.exists():
        print(f"bench: installing {LITELLM_PIN} into {LITELLM_VENV} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(LITELLM_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", LITELLM_PIN], check=True)
        stamp.touch()
    return LITELLM_VENV / "bin" / "litellm"


def spawn(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    handle = log.open("w")
    return subprocess.Popen(command, cwd=REPO, env={**os.environ, **(env or {})}, stdout=handle,
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_http(url: str, process: subprocess.Popen, log: Path, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"bench: {process.args[:3]} exited:\n{log.read_text()[-3000:]}")
        try:
            httpx.get(url, timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.3)
    raise SystemExit(f"bench: {url} did not answer in {timeout:.0f}s:\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def wait_idle(pids: list[int], busy: float = 0.05, writing: int = 256 << 10, interval: float = 0.5,
              limit_s: float = 120.0) -> float:
    """Until these processes use less than `busy` of a core and write less than `writing` bytes to disk over
    `interval`, at most `limit_s`: a gateway still working off the backlog of an overloaded point (LiteLLM
    answers for half a minute after 2,000 RPS; Sluice ships the point's usage records into its database, which
    waits on the disk more than on the CPU) would slow the next point. Returns the seconds waited."""
    started = time.monotonic()
    while pids and time.monotonic() - started < limit_s:
        cpu, written = cpu_seconds(pids), written_bytes(pids)
        time.sleep(interval)
        if cpu_seconds(pids) - cpu < busy * interval and written_bytes(pids) - written < writing:
            break
    # and what every process left in the page cache written out now, not by the kernel's writeback up to 30 s
    # later, in the middle of another target's point: PostgreSQL runs with fsync=off here, and each buffered
    # megabyte flushed meanwhile stalls that point's durable writes (a Sluice answer waits for one)
    os.sync()
    return time.monotonic() - started


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of these processes so far (a process that ended meanwhile counts nothing)."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / TICKS


def written_bytes(pids: list[int]) -> int:
    """Bytes these processes have sent to storage so far, their threads' included."""
    total = 0
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/io").read_text().splitlines()
        except OSError:
            continue
        total += next(int(line.split()[1]) for line in lines if line.startswith("write_bytes:"))
    return total
