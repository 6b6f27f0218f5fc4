"""How many threads a native decode step runs on: of one thread and the whole team, the one whose recent
steps of that size were faster, as measured on this host.

Two threads decode one SmolLM2 row faster than one on an otherwise idle 2-core host (126 against 100 tok/s),
but where another process wakes for every token (a gateway on the same host relaying the stream) the pair's
few hundred barriers a step keep waiting on a descheduled thread, and one thread wins (90 against 65 tok/s
through the gateway; bench/engine_vs_llamacpp.py). Which one wins depends on the host and the step's size,
so the engine measures: per bucket of row counts (powers of two), a smoothed duration for each count; it
runs the faster, and every EXPLORE_EVERY steps of a bucket the other for TRIAL_STEPS, so the estimate follows
the host. A try that finds the other count clearly slower still (CLEAR_MARGIN) doubles the wait before the next,
up to MAX_EXPLORE_EVERY: at 16 rows of Gemma 3 one thread takes 1.6x the pair's time, and trying it every 16
steps cost 7 % of the throughput. A close race is tried every EXPLORE_EVERY steps. The faster count's own
steps are measured all the time, so a host that slows it down makes the other win at once. A step after a
change of count is not measured: the threads' caches hold the other split of the weights then, which would
count against whichever count was just tried; the next one replaces that count's estimate, which is as old
as its last try.
host_load.py still caps the team first (a host busier than its cores gets one thread).
"""

from __future__ import annotations

EXPLORE_EVERY = 16  # a bucket's steps from one try of the count that lost to the next
MAX_EXPLORE_EVERY = 128  # the longest wait, after tries that kept finding the other count clearly slower
CLEAR_MARGIN = 1.25  # the slower count's duration over the faster's that counts as clearly slower
TRIAL_STEPS = 2  # steps of a try: the first one after the change is not measured
_SMOOTHING = 0.25  # weight of the newest duration


class ThreadChoice:
    def __init__(self) -> None:
        self._seconds: dict[tuple[int, int], float] = {}  # (bucket, threads) -> smoothed step duration
        self._steps: dict[int, int] = {}  # bucket -> steps picked
        self._last: dict[int, int] = {}  # bucket -> threads of its latest step
        self._every: dict[int, int] = {}  # bucket -> steps from one try to the next
        self._trial: dict[int, int] = {}  # bucket -> the step its next try starts at
        self._winner: dict[int, int] = {}  # bucket -> the faster count when its latest try ended
        self._fresh: set[int] = set()  # buckets whose next measure replaces its count's estimate (below)

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
        trial = self._trial.setdefault(bucket, EXPLORE_EVERY - TRIAL_STEPS)
        if step < trial:
            return best
        if step < trial + TRIAL_STEPS:
            return other
        # the try is over (its measure is in): wait longer for the next while the same count stays clearly faster
        every = self._every.get(bucket, EXPLORE_EVERY)
        clear = max(alone, together) >= CLEAR_MARGIN * min(alone, together)
        every = min(2 * every, MAX_EXPLORE_EVERY) if clear and self._winner.get(bucket) == best else EXPLORE_EVERY
        self._every[bucket], self._trial[bucket], self._winner[bucket] = every, trial + every, best
        return best

    def record(self, rows: int, threads: int, seconds: float) -> None:
        bucket = rows.bit_length()
        changed = self._last.get(bucket) != threads
        self._last[bucket] = threads
        if changed:
            self._fresh.add(bucket)
            return
        # the first measure after a change replaces the count's estimate: it was last measured many steps ago
        key, before = (bucket, threads), self._seconds.get((bucket, threads))
        fresh = bucket in self._fresh
        self._fresh.discard(bucket)
        self._seconds[key] = seconds if before is None or fresh else (1 - _SMOOTHING) * before + _SMOOTHING * seconds
