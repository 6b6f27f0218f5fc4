"""A failure that recurs at every tick while a dependency is away (Redis, PostgreSQL, the ECS API): its first
occurrence is logged with its traceback, then one line per `every_s` with how many occurred since, and the
recovery once. A traceback per tick per endpoint grew the log by 1.68 MB in 10 s with 10 endpoints (issue #50)."""

from __future__ import annotations

import time

import structlog

log = structlog.get_logger(__name__)
REPEAT_LOG_S = 60.0


class RepeatedFailure:
    def __init__(self, event: str, every_s: float = REPEAT_LOG_S, **context: str):
        self.event = event
        self.every_s = every_s
        self.context = context
        self.failing = False
        self._since_log = 0
        self._next_log = 0.0

    def failed(self, error: BaseException) -> None:
        now = time.monotonic()
        self._since_log += 1
        if not self.failing:
            self.failing = True
            log.warning(self.event, **self.context, exc_info=error)
        elif now >= self._next_log:
            log.warning(f"{self.event}_again", **self.context, error=repr(error), times=self._since_log)
        else:
            return
        self._since_log, self._next_log = 0, now + self.every_s

    def succeeded(self) -> None:
        if self.failing:
            self.failing = False
            log.info(f"{self.event}_recovered", **self.context, times_since_last_line=self._since_log)
            self._since_log = 0
