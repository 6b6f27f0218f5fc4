"""How many torch threads a prefill forward gets: the team only where the host leaves it idle cores.

Prefill runs its matmuls on a team of torch (OpenMP) threads, one per core the decode threads leave idle
during a prefill (runner.py): 1.5x faster on two idle cores. On a host whose other processes keep the cores
busy, each of the forward's few hundred barriers waits until the descheduled team thread runs again: with
11-13 runnable tasks on 2 cores an 8-token forward took 2.6-4.3 s on two threads and 0.34-0.44 s on one
(64 tokens: 8-18 s against 0.8-1.4 s), and the running streams waited through all of it. So before each
prefill forward the engine reads how many tasks are runnable on the host (Linux `/proc/loadavg`, smoothed over
the recent forwards; the engine thread itself is one of them) and runs the team only while the others leave
its extra threads a core each (a passing task aside). Where the count cannot be read the team runs, as before.
"""

from __future__ import annotations

import os

_SMOOTHING = 0.3  # weight of the newest reading


class HostLoad:
    def __init__(self, cores: int | None = None, source: str = "/proc/loadavg"):
        self.cores = cores or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
        self.source = source
        self.others: float | None = None  # runnable tasks besides the engine thread, smoothed
        self._file: tuple[str, int] | None = None  # (source, descriptor): read again from offset 0 each step

    def prefill_threads(self, team: int) -> int:
        """`team`, or 1 when the host's other runnable tasks leave the team's extra threads no idle core."""
        if team <= 1:
            return team
        runnable = self._runnable()
        if runnable is None:
            return team
        others = runnable - 1
        self.others = others if self.others is None else (1 - _SMOOTHING) * self.others + _SMOOTHING * others
        return team if self.others + team < self.cores + 1 else 1  # below one task short of a core each

    def _runnable(self) -> int | None:
        """The count of runnable tasks, read through a descriptor kept open (a decode step reads it: opening the
        file each time cost more than the read); None when it cannot be read."""
        try:
            if self._file is None or self._file[0] != self.source:
                self.close()
                self._file = (self.source, os.open(self.source, os.O_RDONLY))
            return int(os.pread(self._file[1], 256, 0).split()[3].split(b"/")[0])
        except (OSError, IndexError, ValueError):
            return None

    def close(self) -> None:
        if self._file is not None:
            os.close(self._file[1])
            self._file = None

    def __del__(self) -> None:
        self.close()
