"""worker/build_once.py with real processes: builders that start together build once, the others wait
and get the finished directory; a failed or killed builder leaves nothing half-built behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from testkit.sluice import REPO
from worker.build_once import build_once

# a builder process: writes its pid into the copy, slowly (the others arrive while it builds), and
# appends a line to `builds` (how many builds ran)
BUILDER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from worker.build_once import build_once

    target, builds, pause = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])

    def build(staging):
        with builds.open("a") as log:
            log.write(f"{os.getpid()}\\n")
        (staging / "weights").write_text(str(os.getpid()))
        time.sleep(pause)
        (staging / "config.json").write_text("{}")

    print(build_once(target, "config.json", build), flush=True)
""")


def builder(target: Path, builds: Path, pause: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BUILDER, str(target), str(builds), str(pause)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)


def test_builders_that_start_together_build_once_and_all_get_the_copy(tmp_path):
    target, builds = tmp_path / "cache" / "model", tmp_path / "builds"
    processes = [builder(target, builds, pause=1.0) for _ in range(3)]
    outputs = [p.communicate(timeout=120)[0].strip() for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0]
    assert outputs == [str(target)] * 3
    [built_by] = builds.read_text().split()  # one build
    assert (target / "weights").read_text() == built_by and (target / "config.json").exists()
    assert sorted(p.name for p in target.parent.iterdir()) == [".model.lock", "model"]  # no staging left


def test_a_builder_killed_mid_build_leaves_no_copy_and_the_next_one_builds(tmp_path):
    target, builds = tmp_path / "cache" / "model", tmp_path / "builds"
    doomed = builder(target, builds, pause=60)
    while not builds.exists():  # it is inside its build, holding the lock
        assert doomed.poll() is None
        time.sleep(0.05)
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait()
    assert not target.exists()
    survivor = builder(target, builds, pause=0)
    assert survivor.communicate(timeout=120)[0].strip() == str(target)  # the dead one's lock went with it
    assert (target / "weights").read_text() == str(survivor.pid)
    assert sorted(p.name for p in target.parent.iterdir()) == [".model.lock", "model"]  # its staging removed


def test_a_build_that_raises_leaves_nothing_and_the_next_call_builds(tmp_path):
    target = tmp_path / "model"

    def broken(staging: Path) -> None:
        (staging / "weights").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        build_once(target, "config.json", broken)
    assert not target.exists() and not list(tmp_path.glob(".model.staging-*"))
    assert build_once(target, "config.json", lambda staging: (staging / "config.json").write_text("{}")) == target


def test_a_copy_without_its_marker_is_rebuilt_and_a_complete_one_is_reused(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "stale").write_text("from a copy that never finished")
    calls = []

    def build(staging: Path) -> None:
        calls.append(staging)
        (staging / "config.json").write_text("{}")

    assert build_once(target, "config.json", build) == target
    assert sorted(p.name for p in target.iterdir()) == ["config.json"] and len(calls) == 1
    assert build_once(target, "config.json", build) == target and len(calls) == 1
