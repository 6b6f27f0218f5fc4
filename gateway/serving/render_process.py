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
answer, and started afresh if it dies. The job goes over a pipe as one pickle of what rendering reads plus one
blob of token lines per result, the body comes back as bytes: pickling thousands of lines (40 ms for 5 MiB) would
hold the GIL in one piece, where a pipe's reads and writes release it.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.process
import os
from functools import partial
from multiprocessing.connection import Connection

import msgspec

from common.large_bodies import LargeBodyTurns
from gateway.errors import SluiceError, Unavailable
from gateway.lifecycle import start_function_process, stop_function_process
from gateway.serving.collect import Result
from gateway.serving.dialect import Dialect, Meta, Parsed

RENDER_NICENESS = 10
STOP_S = 5.0  # a child whose pipe closed ends at once; one stuck in a render is killed after this
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


def _serve(connection: Connection) -> None:
    """The child: jobs one after another until the gateway closes its end. Each job is a pickle of what rendering
    reads, the token lines of each result as one blob (bytes pickle by copying; thousands of them would not), and
    back come a verdict and the body's bytes."""
    os.nice(RENDER_NICENESS)
    while True:
        try:
            dialect, parsed, results, meta = connection.recv()
            for result in results:
                blob = connection.recv_bytes()
                result.lines = blob.split(b"\n") if blob else []
        except EOFError:
            return
        try:
            body = render(dialect, parsed, results, meta)
        except msgspec.DecodeError as exc:
            connection.send(("unreadable", str(exc)))
        except Exception as exc:  # noqa: BLE001 - a fault of ours: the gateway raises it as one
            connection.send(("failed", f"{type(exc).__name__}: {exc}"))
        else:
            connection.send(("ok", ""))
            connection.send_bytes(body)


class AnswerRenderer:
    """The child process and the turns that feed it (one per gateway process: RENDERER)."""

    def __init__(self, waiting_per_owner: int = WAITING_PER_OWNER):
        self.waiting_per_owner = waiting_per_owner
        self.turns = LargeBodyTurns(waiting_per_owner=None, rest_ratio=0.0, name="sluice-large-answers")
        self.child: multiprocessing.process.BaseProcess | None = None
        self._connection: Connection | None = None

    def check(self, owner: str) -> None:
        """LargeAnswersBusy when `owner` already has `waiting_per_owner` answers waiting for their turn."""
        waiting = self.turns.waiting(owner)
        if waiting >= self.waiting_per_owner:
            raise LargeAnswersBusy(f"{waiting} large answers of yours are waiting to be rendered; retry when they "
                                   "are done")

    async def render(self, owner: str, dialect: Dialect, parsed: Parsed, results: list[Result], meta: Meta) -> bytes:
        """`render` in the child, in `owner`'s turn. The requests stay here: rendering reads only the options, and
        a prompt may be megabytes."""
        return await self.turns.run(owner, partial(self._in_child, dialect, dataclasses.replace(parsed, requests=[]),
                                                   results, meta))

    def _in_child(self, dialect: Dialect, parsed: Parsed, results: list[Result], meta: Meta) -> bytes:
        """On the turns' thread (only it uses the child): the job sent, its body received (reads and writes hold no
        GIL). A child that died is replaced and the job tried once more."""
        blobs = [b"\n".join(result.lines) for result in results]
        light = [dataclasses.replace(result, lines=[], line_bytes=0) for result in results]
        for tries_left in (1, 0):
            connection = self._started()
            try:
                connection.send((dialect, parsed, light, meta))
                for blob in blobs:
                    connection.send_bytes(blob)
                verdict, detail = connection.recv()
                if verdict == "ok":
                    return connection.recv_bytes()
            except (EOFError, OSError):
                self.close()
                if not tries_left:
                    break
                continue
            if verdict == "unreadable":
                raise msgspec.DecodeError(detail)
            raise RuntimeError(f"rendering an answer failed in the render process: {detail}")
        raise Unavailable("the gateway could not render this answer now (its render process stopped); retry")

    def _started(self) -> Connection:
        if self._connection is None or self.child is None or not self.child.is_alive():
            self.close()
            self._connection, self.child = start_function_process(_serve, "sluice-render")
        return self._connection

    def close(self) -> None:
        """Stop the child (it exits when its end of the pipe closes; a stuck one is killed)."""
        connection, child, self._connection, self.child = self._connection, self.child, None, None
        if connection is not None:
            connection.close()
        if child is not None:
            stop_function_process(child, STOP_S)


RENDERER = AnswerRenderer()  # one child per gateway process
