"""A worker's freed large blocks leave its RSS (worker/allocator.py), measured in a fresh interpreter."""

import subprocess
import sys

import pytest

PROBE = """
import sys, torch
from worker.allocator import return_large_blocks
if sys.argv[1] == "set":
    assert return_large_blocks()
def anon_mb():
    return next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("RssAnon"))
big = torch.ones(4 << 20); del big  # a 16 MiB block freed: glibc's own rule raises its threshold to it
blocks = [torch.ones(512 << 10) for _ in range(60)]  # 2 MiB each
before = anon_mb()
del blocks[::2]  # 60 MiB freed, none of it at the heap's top
print(before - anon_mb())
"""


def freed_mb(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120, check=True)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_megabyte_blocks_return_to_the_system_once_set_and_stay_without_it():
    assert freed_mb("set") >= 50
    assert freed_mb("keep") <= 10  # the failure the setting fixes, so the probe can tell the two apart



TRIM_PROBE = """
import time, torch
from worker.allocator import return_large_blocks, trim_periodically
assert return_large_blocks()
def anon_mb():
    return next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("RssAnon"))
blocks = [torch.ones(128 << 10) for _ in range(400)]  # 512 KiB each: under the threshold, on the heap
before = anon_mb()
del blocks[:-1:2]  # ~100 MiB freed between live blocks: the heap cannot shrink from its top
time.sleep(0.3)
kept = before - anon_mb()
assert trim_periodically(0.05)
deadline = time.monotonic() + 120  # until the thread has trimmed: a moment, or longer on a loaded machine
while before - anon_mb() < 80 and time.monotonic() < deadline:
    time.sleep(0.05)
print(kept, before - anon_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_small_blocks_freed_between_live_ones_return_to_the_system_once_the_trim_thread_runs():
    done = subprocess.run([sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, timeout=300, check=True)
    without, with_thread = map(int, done.stdout.split()[-2:])
    assert without <= 10  # they stay until trimmed: the probe tells the two apart
    assert with_thread >= 80


TRIM_ONCE_PROBE = """
import torch
from worker.allocator import return_large_blocks, trim_now
assert return_large_blocks()
def anon_mb():
    return next(int(l.split()[1]) // 1024 for l in open("/proc/self/status") if l.startswith("RssAnon"))
blocks = [torch.ones(128 << 10) for _ in range(400)]  # 512 KiB each: on the heap
before = anon_mb()
del blocks[:-1:2]  # ~100 MiB freed between live blocks
kept = before - anon_mb()
assert trim_now()
print(kept, before - anon_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_one_trim_returns_the_small_blocks_freed_between_live_ones():
    """What a grammar compile process calls after its table and each compile (it runs no trim thread)."""
    done = subprocess.run([sys.executable, "-c", TRIM_ONCE_PROBE], capture_output=True, text=True, timeout=300,
                          check=True)
    without, trimmed = map(int, done.stdout.split()[-2:])
    assert without <= 10
    assert trimmed >= 80
