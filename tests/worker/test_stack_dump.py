"""A worker that never gets ready can be asked where it is: SIGUSR1 writes every thread's Python stack into the
gateway's log (worker/__main__.py), and the test kit asks for them when a start times out (testkit/sluice.py)."""

from __future__ import annotations

import time

import httpx


def test_a_worker_writes_every_threads_stack_when_asked(sluice_on_smol):
    before = len(sluice_on_smol.output)
    sluice_on_smol.dump_worker_stacks(settle_s=0)
    deadline = time.monotonic() + 60  # a bound for a dump that never comes, not a timing
    # The dump arrives line by line through the gateway's stderr: wait for the serving thread's stack itself,
    # not merely the first thread's header.
    while "uvicorn" not in sluice_on_smol.output[before:] and time.monotonic() < deadline:
        time.sleep(0.1)
    dump = sluice_on_smol.output[before:]
    assert "Thread 0x" in dump and "most recent call first" in dump
    assert "uvicorn" in dump  # the worker's own serving thread, not some other process's stack
    assert httpx.get(f"{sluice_on_smol.url}/health", timeout=30).status_code == 200  # it only asked: still serving


def test_the_tail_shown_for_a_slow_start_leaves_out_the_test_kits_polls(sluice_on_smol):
    assert '"path":"/health"' in sluice_on_smol.output  # the kit polled while the server started
    assert '"path":"/health"' not in sluice_on_smol.output_without_polls()
