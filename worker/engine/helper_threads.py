"""Daemon threads that run calls beside the calling thread (the runner's decode row groups).

Daemon, because a runner is dropped without a close in many places (tests, benches) and its idle
helpers must never keep the process alive.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class HelperThreads:
    def __init__(self, count: int, name: str = "sluice-helper"):
        self._inboxes: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(count)]
        for index, inbox in enumerate(self._inboxes):
            threading.Thread(target=self._serve, args=(inbox,), name=f"{name}-{index}", daemon=True).start()

    @property
    def count(self) -> int:
        return len(self._inboxes)

    def run(self, calls: list[Callable[[], object]]) -> list[object]:
        """Results of `calls`, in order: the first runs on this thread, the others on one helper each
        (at most `count` of them). An exception in any call is raised here once all have finished."""
        if len(calls) - 1 > self.count:
            raise ValueError(f"{len(calls)} calls for {self.count} helpers and this thread")
        replies: queue.SimpleQueue = queue.SimpleQueue()
        for index, call in enumerate(calls[1:], start=1):
            self._inboxes[index - 1].put((index, call, replies))
        results: list[object] = [None] * len(calls)
        errors: list[BaseException] = []
        try:
            results[0] = calls[0]()
        except BaseException as error:  # noqa: BLE001 - re-raised once the helpers are done
            errors.append(error)
        for _ in calls[1:]:
            index, ok, value = replies.get()
            if ok:
                results[index] = value
            else:
                errors.append(value)
        if errors:
            raise errors[0]
        return results

    @staticmethod
    def _serve(inbox: queue.SimpleQueue) -> None:
        while True:
            index, call, replies = inbox.get()
            try:
                replies.put((index, True, call()))
            except BaseException as error:  # noqa: BLE001 - handed to the caller
                replies.put((index, False, error))
