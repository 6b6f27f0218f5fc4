"""Reading the workers' events into the client's answer: a collected answer (`collect_answer`) or a stream's events
(`honest`, `within`). Both fail a request whose choice failed in a way the dialect cannot say
(`refuse_failed_choice`), close the worker streams the moment they end (each holds a worker connection), and run
for at most `request_timeout_s` (`RelayTimeout`, the one timer of a request's relay).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from common.protocol import Event, Finish
from gateway.errors import GenerationFailed, RequestTimedOut
from gateway.replicas.token_lines import TokenLines
from gateway.serving.collect import Result, merge
from gateway.serving.dialect import Dialect

FAILED_FINISHES = {
    "error": "choice {index} failed: the structured-output grammar refused the model's next token, so the output "
             "so far is not valid; retry, or loosen the schema",
    "cancelled": "choice {index} was cancelled by the worker before it finished",
}


class RelayTimeout:
    """`seconds` (request_timeout_s) for a request's whole relay, from its first read of worker events: one timer,
    where asyncio.timeout per event cost a tenth of a streamed token's relay (and about 2 % of a collected
    request). When it fires it cancels the task reading worker events at that moment (`reader`), if any; that
    reader asks `expired` in its `except CancelledError` and raises `error()`, while a cancel from elsewhere (the
    client left) stays a cancel. Past the limit the workers are let go before the concurrency lease expires."""

    __slots__ = ("seconds", "fired", "reader", "loop", "_timer")

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False
        self.reader: asyncio.Task | None = None  # the task waiting for worker events now
        # asyncio.current_task(loop) for each event: without the loop it is three times as long (Python 3.11)
        self.loop = asyncio.get_running_loop()
        self._timer = self.loop.call_later(seconds, self._fire)

    def _fire(self) -> None:
        self.fired = True
        if self.reader is not None:
            self.reader.cancel()

    def expired(self, task: asyncio.Task) -> bool:
        """Whether the cancel `task` caught was this timer's alone (taken back then); a client's stays a cancel."""
        return self.fired and task.uncancel() == 0

    def error(self) -> RequestTimedOut:
        return RequestTimedOut(f"the request ran past this gateway's limit of {self.seconds:g} s (request_timeout_s); "
                               "ask for fewer tokens or split it")

    def stop(self) -> None:
        self._timer.cancel()
        self.reader = None


def refuse_failed_choice(dialect: Dialect, event: Event) -> None:
    """A choice the worker ended by failing (a grammar that refused the model's token: its output is not valid;
    or cancelled) fails the request in a dialect whose finish vocabulary has no word for it, rather than pass for
    a normal finish ("stop", "length"): the error status, or the stream's error event."""
    if isinstance(event, Finish) and event.reason in FAILED_FINISHES and not dialect.reports_failed_choices:
        raise GenerationFailed(FAILED_FINISHES[event.reason].format(index=event.index))


def _merged(streams: list[AsyncIterator[Event]]) -> AsyncIterator[Event] | AsyncIterator[tuple[int, Event]]:
    """The usual single worker stream as it is (its items are events: no merging generator in between), or
    several merged into (stream index, event) pairs."""
    return streams[0] if len(streams) == 1 else merge(streams)


async def honest(dialect: Dialect, streams: list[AsyncIterator[Event]]) -> AsyncIterator[tuple[int, Event]]:
    """The streams' events as (stream index, event), a failed choice failing the request (`refuse_failed_choice`)."""
    single = len(streams) == 1
    events = _merged(streams)
    try:
        async for item in events:
            index, event = (0, item) if single else item
            refuse_failed_choice(dialect, event)
            yield index, event
    finally:  # closed now, not when the collector finds it: it holds a worker connection
        await events.aclose()


async def within(seconds: float, events: AsyncIterator[tuple[int, Event]]) -> AsyncIterator[tuple[int, Event]]:
    """The events of a stream that may run `seconds` in all (`RelayTimeout`): past that RequestTimedOut."""
    timeout = RelayTimeout(seconds)
    loop, current_task = timeout.loop, asyncio.current_task
    try:
        while not timeout.fired:  # it may fire while the stream writes to its client: the next read ends it
            task = timeout.reader = current_task(loop)
            try:
                item = await anext(events)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                if timeout.expired(task):
                    break
                raise
            finally:
                timeout.reader = None
            yield item
        raise timeout.error()
    finally:
        timeout.stop()
        await events.aclose()


async def collect_answer(dialect: Dialect, streams: list[AsyncIterator[Event | TokenLines]],
                         observe: Callable[[Event | TokenLines], None], seconds: float) -> list[Result]:
    """Every event of a non-streamed answer, each `observe`d (accounting) and gathered per stream, a failed choice
    failing it (`refuse_failed_choice`), within `seconds` in all (`RelayTimeout`): past that RequestTimedOut, every
    stream closed. The streams are read here, not through `honest`: a generator less per event."""
    results = [Result() for _ in streams]
    single = len(streams) == 1
    task = asyncio.current_task()
    timeout = RelayTimeout(seconds)
    timeout.reader = task  # the whole collection reads worker events
    try:
        async with aclosing(_merged(streams)) as events:  # closed now: it holds worker connections
            async for item in events:
                index, event = (0, item) if single else item
                refuse_failed_choice(dialect, event)
                observe(event)
                results[index].add(event)
    except asyncio.CancelledError:
        if timeout.expired(task):
            raise timeout.error() from None
        raise
    finally:
        timeout.stop()
    return results
