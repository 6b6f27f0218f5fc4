"""Start-up work that waits for the engine's first quiet moment (the grammar vocabulary and its compile
processes: ~0.3 s of the engine process's CPU and two child processes' starts; under q4 the scripted decode
layers too, ~0.7 s of the engine thread, which only adapter rows use there).

A worker woken from zero by a burst takes traffic the moment it is ready; work started then would run
beside the burst's first steps on the same cores (and, in a thread of this process, take the GIL between
each of their torch calls). Here it runs once the engine has had nothing to do for `QUIET_S`, counted
from the later of its last activity and the work's arrival. A request that needs the work first does it
itself (a first constrained request builds the vocabulary; an adapter row decodes on the Python path), so
waiting costs nobody a wrong answer. The work runs in the engine thread between steps: a request arriving
meanwhile waits for the job under way.
"""

from __future__ import annotations

from collections.abc import Callable

QUIET_S = 2.0  # nothing to do for this long: a woken worker's first burst, if any, is over


class QuietWork:
    def __init__(self, quiet_s: float = QUIET_S):
        self.quiet_s = quiet_s
        self._work: list[Callable[[], None]] = []
        self._quiet_since = 0.0

    @property
    def pending(self) -> bool:
        """Work waits, or runs now."""
        return bool(self._work)

    def add(self, work: Callable[[], None], now: float) -> None:
        """Run `work` at the first quiet moment after `now` (the engine's clock: time.monotonic)."""
        self._work.append(work)
        self._quiet_since = max(self._quiet_since, now)

    def busy(self, now: float) -> None:
        """The engine had something to do at `now`."""
        self._quiet_since = now

    def run_if_quiet(self, now: float) -> None:
        """Run what waits, if the engine has been quiet for `quiet_s` by `now`."""
        while self._work and now - self._quiet_since >= self.quiet_s:
            self._work[0]()
            del self._work[0]
