"""Threads of a bench's process that stand in for other machines (attacking clients, a stub worker).

In production the attackers and the worker run on other machines; in a bench they share the gateway's two cores.
Their threads run STAND_IN_NICENESS steps below it (nice is per thread on Linux; the main thread, which forks the
probes, stays as it is), so a p99 shows what the gateway adds, not what the bench's stand-ins take from it.
"""

from __future__ import annotations

import contextlib
import os
import threading

STAND_IN_NICENESS = 10


def below_the_gateway(thread_ids: list[int] | None = None) -> None:
    """Nice the given threads of this process (default: every one but the main thread) by STAND_IN_NICENESS."""
    main = threading.main_thread().native_id
    for tid in thread_ids or [int(t) for t in os.listdir("/proc/self/task") if int(t) != main]:
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.setpriority(os.PRIO_PROCESS, tid, STAND_IN_NICENESS)
