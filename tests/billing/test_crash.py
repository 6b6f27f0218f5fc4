"""SIGKILL mid-run: every id whose record() returned is in the database exactly once after the
next start, also when the log is replayed a second time."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from billing.ledger import Ledger
from billing.usage import UsageQuery

ROOT = Path(__file__).resolve().parents[2]


def run_and_kill(database_url: str, wal_dir: Path, at_least: int) -> list[str]:
    child = subprocess.Popen([sys.executable, "-m", "tests.billing.crash_writer", database_url, str(wal_dir)],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    lines: list[bytes] = []
    deadline = time.monotonic() + 60
    try:
        assert child.stdout.readline() == b"ready\n"
        while len(lines) < at_least and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break  # the writer died on its own; the assertion below reports it
            lines.append(line)
    finally:
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate()
    lines.extend(rest.splitlines(keepends=True))
    # a line cut by the kill has no newline: its record() had returned but the id may be partial
    ids = [line.rstrip(b"\n").decode() for line in lines if line.endswith(b"\n")]
    assert len(ids) >= at_least, "the writer did not produce enough records before the deadline"
    return ids


async def test_sigkill_loses_no_acknowledged_record(database_url, wal_dir, pricing, tmp_path):
    # the second child starts by replaying the first one's log, and is killed in turn
    acknowledged = run_and_kill(database_url, wal_dir, at_least=2500)
    acknowledged += run_and_kill(database_url, wal_dir, at_least=1500)
    assert len(acknowledged) == len(set(acknowledged))
    backup = tmp_path / "wal-after-kill"
    shutil.copytree(wal_dir, backup)

    for _ in range(2):  # the second start replays the very same log again
        shutil.rmtree(wal_dir)
        shutil.copytree(backup, wal_dir)
        ledger = await Ledger.open(database_url, wal_dir, pricing)
        try:
            counts = await ledger.store.count(acknowledged)
            missing = [rid for rid, n in counts.items() if n != 1]
            assert missing == [], f"{len(missing)} acknowledged records missing"
            stored = await ledger.records(UsageQuery(start=0, end=4e9))
            ids = [e.usage.request_id for e in stored]
            assert len(ids) == len(set(ids))  # nothing duplicated (records never acknowledged may exist)
            assert len(ids) >= len(acknowledged)
        finally:
            await ledger.close()
    assert os.listdir(wal_dir) == []
