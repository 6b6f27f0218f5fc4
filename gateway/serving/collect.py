"""Gather a worker event stream into one result (for non-streamed replies) and merge fan-outs.

A collected answer's tokens may come undecoded (TokenLines, gateway/replicas/token_lines.py): a Result keeps
them as the pieces they came in, and whoever renders it decodes them first (`decode_lines`), where the answer is
rendered.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import msgspec

from common.protocol import Accepted, Done, Event, Finish, Token, decode_event, encode_event
from gateway.replicas.token_lines import TokenLines, split_lines


@dataclass
class Choice:
    finish: Finish | None = None
    tokens: list[Token] = field(default_factory=list)


@dataclass
class Result:
    accepted: Accepted | None = None
    choices: dict[int, Choice] = field(default_factory=dict)
    done: Done | None = None
    weight: int = 0  # what rendering it walks: each token and every value it carries (answer_body.py)
    # tokens not decoded yet, in the order they came: pieces of whole token lines (TokenLines.piece)
    pieces: list[bytes] = field(default_factory=list)
    line_bytes: int = 0  # their size: what decoding and rendering them costs grows with it

    def add(self, event: Event | TokenLines) -> None:
        if isinstance(event, TokenLines):
            self.pieces.append(event.piece)
            self.line_bytes += len(event.piece)
        elif isinstance(event, Accepted):
            self.accepted = event
        elif isinstance(event, Token):
            if self.pieces:  # after tokens still undecoded: it goes after them
                line = encode_event(event)
                self.pieces.append(line)
                self.line_bytes += len(line)
                return
            self.choices.setdefault(event.index, Choice()).tokens.append(event)
            self.weight += 1 + sum(len(values) for values in (event.top_logprobs, event.token_ids_logprobs,
                                                               event.hidden_state, event.logits) if values)
        elif isinstance(event, Finish):
            self.choices.setdefault(event.index, Choice()).finish = event
        elif isinstance(event, Done):
            self.done = event

    def decode_lines(self) -> None:
        """The tokens kept as lines decoded into their choices, as if they had come decoded. msgspec.DecodeError:
        a line is not an event of the contract."""
        pieces, self.pieces, self.line_bytes = self.pieces, [], 0
        for line in (line for piece in pieces for line in split_lines(piece)):
            event = decode_event(line)
            if not isinstance(event, Token):  # TOKEN_LINE matched the start of something else
                raise msgspec.DecodeError(f"expected a token event, got {type(event).__name__}")
            self.add(event)

    def ordered(self) -> list[Choice]:
        return [self.choices[i] for i in sorted(self.choices)]


async def collect(events: AsyncIterator[Event]) -> Result:
    result = Result()
    async for event in events:
        result.add(event)
    return result


async def merge(streams: list[AsyncIterator[Event]]) -> AsyncIterator[tuple[int, Event]]:
    """Interleave several event streams as (stream index, event), in arrival order."""
    if len(streams) == 1:
        try:
            async for event in streams[0]:
                yield 0, event
        finally:  # closed now, not when the collector finds it: it holds a worker connection
            await streams[0].aclose()
        return
    queue: asyncio.Queue = asyncio.Queue()
    end = object()

    async def pump(index: int, stream: AsyncIterator[Event]) -> None:
        try:
            async for event in stream:
                await queue.put((index, event))
        except BaseException as exc:  # re-raised in the consumer
            await queue.put((index, exc))
        finally:
            await queue.put((index, end))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    remaining = len(tasks)
    try:
        while remaining:
            index, item = await queue.get()
            if item is end:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        # a pump still inside its stream's next event would make that stream's aclose fail ("already running")
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
