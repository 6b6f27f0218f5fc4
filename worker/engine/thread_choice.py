"""How many threads a native decode step runs on: of one thread and the whole team, the one whose recent
steps of that size were faster, as measured on this host.

Two threads decode one SmolLM2 row faster than one on an otherwise idle 2-core host (126 against 100 tok/s),
but where another process wakes for every token (a gateway on the same host relaying the stream) the pair's
few hundred barriers a step keep waiting on a descheduled thread, and one thread wins (90 against 65 tok/s
through the gateway; bench/engine_vs_llamacpp.py). Which one wins depends on the host and the step's size,
so the engine measures: per bucket of row counts (powers of two), a smoothed duration for each count; it
runs the faster, and every EXPLORE_EVERY steps of a bucket the other for TRIAL_STEPS, so the estimate follows
the host. A step after a change of count is not measured: the threads' caches hold the other split of the
weights then, which would count against whichever count was just tried.
host_load.py still caps the team first (a host busier than its cores gets one thread).
"""

from __future__ import annotations

EXPLORE_EVERY = 16  # a bucket's steps from one try of the count that lost to the next
TRIAL_STEPS = 2  # steps of a try: the first one after the change is not measured
_SMOOTHING = 0.25  # weight of the newest duration


class ThreadChoice:
    def __init__(self) -> None:
        self._seconds: dict[tuple[int, int], float] = {}  # (bucket, threads) -> smoothed step duration
        self._steps: dict[int, int] = {}  # bucket -> steps picked
        self._last: dict[int, int] = {}  # bucket -> threads of its latest step

    def pick(self, rows: int, team: int) -> int:
        """Threads for a step of `rows` rows: 1 or `team` (what the host allows now)."""
        if team <= 1:
            return team
        bucket = rows.bit_length()
        step = self._steps.get(bucket, 0)
        self._steps[bucket] = step + 1
        alone, together = self._seconds.get((bucket, 1)), self._seconds.get((bucket, team))
        if together is None:
            return team
        if alone is None:
            return 1
        best, other = (1, team) if alone < together else (team, 1)
        return other if step % EXPLORE_EVERY >= EXPLORE_EVERY - TRIAL_STEPS else best

    def record(self, rows: int, threads: int, seconds: float) -> None:
        bucket = rows.bit_length()
        changed = self._last.get(bucket) != threads
        self._last[bucket] = threads
        if changed:
            return
        key, before = (bucket, threads), self._seconds.get((bucket, threads))
        self._seconds[key] = seconds if before is None else (1 - _SMOOTHING) * before + _SMOOTHING * seconds
