"""Large collected answers are decoded, rendered and encoded in a process of their own, in teams' turns.

A collected answer of `n` = 32 with 20 top logprobs a token (12 MiB of JSON) takes a second of pure Python to
decode, render and encode. On the event loop that second is every other team's; in a thread it still is, for the
thread and the loop share one GIL (a thread rendering it kept `/livez` at 20-40x idle). So the work goes to a
child process, which holds no lock of the gateway's: the loop only hands over the worker's lines (a pickle of
bytes) and receives the body's bytes. The child runs RENDER_NICENESS steps below the gateway, so on a busy host
the loop wins every contest for a core.

One child, fed by one thread of turns (common/large_bodies.py's LargeBodyTurns, without its rest: the GIL is not
what the child spends): owners (the team, else the key) are served round robin, so a team that keeps large answers
coming waits behind its own, and another team's answer waits for one render at most. An owner with
WAITING_PER_OWNER answers already waiting is refused its next collected request before a worker is asked
(`check`: 429 large_answers_busy), not after its tokens were generated.

The child is started by `spawn` (a fork of a process with an event loop and threads is unsafe), on the first large
answer, and started afresh if it dies.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import multiprocessing
import os
import threading
from concurrent.futures.process import BrokenProcessPool
from functools import partial

import msgspec

from common.large_bodies import LargeBodyTurns
from gateway.errors import SluiceError, Unavailable
from gateway.serving.collect import Result
from gateway.serving.dialect import Dialect, Meta, Parsed

RENDER_NICENESS = 10
WAITING_PER_OWNER = 4

_json = msgspec.json.Encoder()


class LargeAnswersBusy(SluiceError):
    status, type, code = 429, "rate_limit_exceeded", "large_answers_busy"
    retry_after_s = 1.0


def render(dialect: Dialect, parsed: Parsed, results: list[Result], meta: Meta) -> bytes:
    """The answer's body: its tokens decoded, rendered in the dialect, encoded (in the child, or on the loop for a
    small answer). msgspec.DecodeError: a token line is not an event of the contract."""
    for result in results:
        result.decode_lines()
    return _json.encode(dialect.render(parsed, results, meta))


def _lower_priority() -> None:
    os.nice(RENDER_NICENESS)


class AnswerRenderer:
    """The child process and the turns that feed it (one per gateway process: RENDERER)."""

    def __init__(self, waiting_per_owner: int = WAITING_PER_OWNER):
        self.waiting_per_owner = waiting_per_owner
        self.turns = LargeBodyTurns(waiting_per_owner=None, rest_ratio=0.0, name="sluice-large-answers")
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._starting = threading.Lock()

    def check(self, owner: str) -> None:
        """LargeAnswersBusy when `owner` already has `waiting_per_owner` answers waiting for their turn."""
        waiting = self.turns.waiting(owner)
        if waiting >= self.waiting_per_owner:
            raise LargeAnswersBusy(f"{waiting} large answers of yours are waiting to be rendered; retry when they "
                                   "are done")

    async def render(self, owner: str, dialect: Dialect, parsed: Parsed, results: list[Result], meta: Meta) -> bytes:
        """`render` in the child, in `owner`'s turn. The requests stay here: rendering reads only the options, and
        a prompt may be megabytes."""
        job = partial(render, dialect, dataclasses.replace(parsed, requests=[]), results, meta)
        return await self.turns.run(owner, partial(self._in_child, job))

    def _in_child(self, job: partial[bytes]) -> bytes:
        """On the turns' thread: the job in the child, waited for (the wait holds no GIL). A child that died is
        replaced and the job tried once more."""
        for tries_left in (1, 0):
            pool = self._child()
            try:
                return pool.submit(job.func, *job.args).result()
            except BrokenProcessPool:
                with self._starting:
                    if self._pool is pool:
                        self._pool = None
                pool.shutdown(wait=False)
                if not tries_left:
                    break
        raise Unavailable("the gateway could not render this answer now (its render process stopped); retry")

    def _child(self) -> concurrent.futures.ProcessPoolExecutor:
        with self._starting:
            if self._pool is None:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=1, mp_context=multiprocessing.get_context("spawn"), initializer=_lower_priority)
            return self._pool

    def close(self) -> None:
        with self._starting:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


RENDERER = AnswerRenderer()  # one child per gateway process
