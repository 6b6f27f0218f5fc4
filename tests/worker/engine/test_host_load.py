"""Prefill's thread team runs only where the host leaves it idle cores (worker/engine/host_load.py), read from a
file in /proc/loadavg's format."""

from __future__ import annotations

from worker.engine.host_load import HostLoad


def loadavg(tmp_path, runnable: int) -> str:
    path = tmp_path / f"loadavg-{runnable}"
    path.write_text(f"3.10 2.50 1.90 {runnable}/412 8765\n")
    return str(path)


def test_the_team_runs_on_idle_cores_and_one_thread_on_a_busy_host(tmp_path):
    assert HostLoad(cores=2, source=loadavg(tmp_path, 1)).prefill_threads(2) == 2  # the engine thread alone
    assert HostLoad(cores=2, source=loadavg(tmp_path, 12)).prefill_threads(2) == 1
    assert HostLoad(cores=8, source=loadavg(tmp_path, 5)).prefill_threads(4) == 4
    assert HostLoad(cores=2, source=loadavg(tmp_path, 12)).prefill_threads(1) == 1


def test_a_single_busy_reading_does_not_flip_a_quiet_host(tmp_path):
    host = HostLoad(cores=2, source=loadavg(tmp_path, 1))
    for _ in range(5):
        host.prefill_threads(2)
    host.source = loadavg(tmp_path, 3)  # one other task for a moment
    assert host.prefill_threads(2) == 2
    for _ in range(5):
        host.prefill_threads(2)
    assert host.prefill_threads(2) == 1  # it stays: the host is busy


def test_an_unreadable_count_keeps_the_team(tmp_path):
    assert HostLoad(cores=2, source=str(tmp_path / "missing")).prefill_threads(2) == 2
    garbled = tmp_path / "garbled"
    garbled.write_text("not a loadavg\n")
    assert HostLoad(cores=2, source=str(garbled)).prefill_threads(2) == 2


def test_each_reading_is_the_files_current_count(tmp_path):
    """The file stays open between readings: each still sees what it says now."""
    path = tmp_path / "loadavg"
    path.write_text("0.10 0.10 0.10 1/400 1\n")
    host = HostLoad(cores=2, source=str(path))
    assert host.prefill_threads(2) == 2
    path.write_text("0.10 0.10 0.10 12/400 1\n")  # rewritten in place, as /proc/loadavg changes under a reader
    assert [host.prefill_threads(2) for _ in range(3)][-1] == 1
    host.source = str(tmp_path / "missing")  # a source that cannot be read keeps the team
    assert host.prefill_threads(2) == 2
    host.close()
