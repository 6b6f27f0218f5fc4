"""Large request bodies are decoded (and parsed) off the event loop, in turns, at a bounded share of the process.

One event loop serves every team's requests, and decoding a 4 MiB body of 400k token ids, then converting them,
holds it for tens of milliseconds in C (msgspec keeps the GIL). A few clients sending such bodies back to back
put one of those pauses between every two steps of everyone else's request. So a body over `LARGE_BODY_BYTES`
is decoded on the one thread here, never on the loop, and:
- in turns: one queue per owner (the team, else the key, else the client address), served round robin, so
  one owner's flood waits behind its own bodies, not in front of another owner's;
- at a bounded share: after each job the thread rests `REST_RATIO` times as long as the job took, so large
  bodies get at most a third of the process's time (the GIL) however many arrive, and the loop the rest;
- bounded: an owner with `WAITING_PER_OWNER` bodies waiting gets 429 `large_bodies_busy` for the next one,
  before it is decoded, and before it is read when its content-length says it is large. The gateway counts that
  refusal against the key's rejection budget (gateway/serving/rejections.py): a client that keeps sending while
  its own bodies wait is refused whole before long.
A small body is decoded on the loop at once: that costs less than the hand-over."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from common.errors import SluiceError

LARGE_BODY_BYTES = 256 << 10  # about 2 ms of decoding at worst: below, the loop does it
REST_RATIO = 2.0  # the thread rests twice as long as it worked: large bodies take at most a third of the time
WAITING_PER_OWNER = 4

T = TypeVar("T")


class LargeBodiesBusy(SluiceError):
    status, type, code = 429, "rate_limit_exceeded", "large_bodies_busy"
    retry_after_s = 1.0


class _Job:
    __slots__ = ("loop", "future", "work")

    def __init__(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], work: Callable[[], Any]):
        self.loop, self.future, self.work = loop, future, work


class LargeBodyTurns:
    """One daemon thread that runs owners' jobs round robin, resting between them (module docstring)."""

    def __init__(self, waiting_per_owner: int | None = WAITING_PER_OWNER, rest_ratio: float = REST_RATIO,
                 name: str = "sluice-large-bodies"):
        # waiting_per_owner None: `run` refuses nothing (the caller bounds what waits, as `waiting` tells it)
        self.waiting_per_owner, self.rest_ratio, self.name = waiting_per_owner, rest_ratio, name
        self._waiting: OrderedDict[str, deque[_Job]] = OrderedDict()  # owners with jobs, next first
        self._ready = threading.Condition()
        self._thread: threading.Thread | None = None
        self.thread_ident: int | None = None  # the thread that runs the jobs (tests check where work ran)

    async def run(self, owner: str, work: Callable[[], T]) -> T:
        """`work()` in `owner`'s turn on the thread; its result or its exception. LargeBodiesBusy at once when
        the owner already has `waiting_per_owner` jobs waiting."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._ready:
            self._check_room(owner)
            self._waiting.setdefault(owner, deque()).append(_Job(loop, future, work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()
            self._ready.notify()
        return await future

    def check_room(self, owner: str) -> None:
        """LargeBodiesBusy now if `owner` has no room for another job: asked before a large body is read, so a
        refused one costs its head only."""
        with self._ready:
            self._check_room(owner)

    def _check_room(self, owner: str) -> None:
        waiting = self._waiting.get(owner)
        if waiting is not None and self.waiting_per_owner is not None and len(waiting) >= self.waiting_per_owner:
            raise LargeBodiesBusy(f"{len(waiting)} large request bodies of yours are already waiting to be read; "
                                  "retry when they are done")

    def waiting(self, owner: str) -> int:
        """How many of `owner`'s jobs wait for their turn (the one running not counted)."""
        with self._ready:
            return len(self._waiting.get(owner, ()))

    def _take(self) -> _Job:
        with self._ready:
            while not self._waiting:
                self._ready.wait()
            owner, waiting = next(iter(self._waiting.items()))
            job = waiting.popleft()
            if waiting:
                self._waiting.move_to_end(owner)  # the next owner goes first
            else:
                del self._waiting[owner]
            return job

    def _serve(self) -> None:
        self.thread_ident = threading.get_ident()
        while True:
            job = self._take()
            if job.future.cancelled():  # its client left while it waited
                continue
            started = time.perf_counter()
            try:
                result, error = job.work(), None
            except Exception as exc:  # noqa: BLE001 - the caller's to raise
                result, error = None, exc
            took = time.perf_counter() - started
            try:
                job.loop.call_soon_threadsafe(_settle, job.future, result, error)
            except RuntimeError:  # its loop closed
                pass
            if self.rest_ratio:
                time.sleep(took * self.rest_ratio)  # sleeping releases the GIL: the loop has it


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


TURNS = LargeBodyTurns()  # one per process: the share is of the process's one GIL


def owner_of(scope: Mapping[str, Any]) -> str:
    """Whose turn a request's body takes: its team, else its key, else its client address."""
    team = getattr(scope.get("user"), "team_id", None)
    if team:
        return f"team:{team}"
    if scope.get("auth"):
        return f"key:{scope['auth']}"
    client = scope.get("client")
    return f"address:{client[0] if client else ''}"
