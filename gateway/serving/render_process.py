"""Large collected answers are decoded, rendered and encoded in a process of their own, in teams' turns.

A collected answer of `n` = 32 with 20 top logprobs a token (12 MiB of JSON) takes a second of pure Python to
decode, render and encode. On the event loop that second is every other team's; in a thread it still is, for the
thread and the loop share one GIL (a thread rendering it kept `/livez` at 20-40x idle). So the work goes to a
child process, which holds no lock of the gateway's: the loop only hands over the worker's lines and receives the
body's bytes. The child runs RENDER_NICENESS steps below the gateway (`lower_priority`), so on a busy host the loop
wins every contest for a core.

One child, fed by one thread of turns (common/large_bodies.py's LargeBodyTurns, without its rest: the GIL is not
what the child spends): owners (the team, else the key) are served round robin, so a team that keeps large answers
coming waits behind its own, and another team's answer waits for one render at most. An owner with
WAITING_PER_OWNER answers already waiting is refused its next collected request before a worker is asked
(`check`: 429 large_answers_busy), not after its tokens were generated.

The child is started by `spawn` (a fork of a process with an event loop and threads is unsafe), on the first large
answer, and started afresh if it dies. The job goes over a socket pair as one pickle of what rendering reads and
the sizes of what follows, then the token lines as the relay received them; the body comes back the same way (a
verdict with its size, then its bytes). The bytes are written by `sendall` and read by `receive_exactly`, in C with
the GIL released: pickling thousands of lines (40 ms for 5 MiB), joining them, or a Connection's `recv_bytes` of
the body (a buffer grown and copied 64 KiB at a time) held the GIL for milliseconds that the loop waited for.
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import multiprocessing.process
import os
import socket
from functools import partial
from multiprocessing.connection import Connection

import msgspec

from common.large_bodies import LargeBodyTurns
from common.long_lived import freeze_what_lives_on
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


def lower_priority() -> None:
    """RENDER_NICENESS steps below the gateway: on a busy host the loop wins a core over this process. Not the
    SCHED_IDLE policy, which would give it one only when nothing else wants one: beside local workers generating,
    or another test's process, a large answer would wait for minutes (an idle-policy process gets a 300th of a
    core beside one busy process of normal priority)."""
    os.nice(RENDER_NICENESS)


def _serve(connection: Connection) -> None:
    """The child: jobs one after another until the gateway closes its end."""
    lower_priority()
    freeze_what_lives_on()
    bulk = bulk_socket(connection)
    while run_job(connection, bulk):
        pass


def run_job(connection: Connection, bulk: socket.socket) -> bool:
    """One job with no cycle collection during it; False when the gateway closed its end. Decoding an answer makes
    millions of objects that all live until it is rendered, so the collector's allocation counts kept starting full
    collections that walked them all: 0.2 s of each 0.4 s render of a 12 MiB answer (265 collections of ~74 ms for
    86 answers). What a job made is freed by reference counting when `_job` returns (tokens, lists and dicts hold no
    cycles), before the collector runs again."""
    gc.disable()
    try:
        return _job(connection, bulk)
    finally:
        gc.enable()


def _job(connection: Connection, bulk: socket.socket) -> bool:
    """One job: a pickle of what rendering reads and how many bytes of token lines each result has, then those
    bytes; back go a verdict with the body's size, then the body. False when the gateway closed its end."""
    try:
        dialect, parsed, results, sizes, meta = connection.recv()
        for result, size in zip(results, sizes, strict=True):
            result.pieces = [receive_exactly(bulk, size)] if size else []  # pieces of whole lines, joined
    except EOFError:
        return False
    try:
        body = render(dialect, parsed, results, meta)
    except msgspec.DecodeError as exc:
        connection.send(("unreadable", str(exc)))
    except Exception as exc:  # noqa: BLE001 - a fault of ours: the gateway raises it as one
        connection.send(("failed", f"{type(exc).__name__}: {exc}"))
    else:
        connection.send(("ok", len(body)))
        bulk.sendall(body)
    return True


def bulk_socket(connection: Connection) -> socket.socket:
    """The connection's socket (a duplex Pipe is a socket pair) as a socket of its own: for bytes whose size the
    other end was told, written with `sendall` and read with `receive_exactly`, which copy no byte holding the GIL.
    A Connection's `send_bytes` re-slices what a write left over (a copy each time) and its `recv_bytes` grows a
    buffer 64 KiB at a time (a copy at each growth): on megabytes, milliseconds of the GIL at a time, which the
    gateway's event loop waited for."""
    return socket.socket(fileno=os.dup(connection.fileno()))


def receive_exactly(bulk: socket.socket, size: int) -> bytes:
    """`size` bytes from `bulk`, the kernel writing them straight into the bytes object (MSG_WAITALL, the GIL
    released). EOFError when the other end closed first."""
    data = bulk.recv(size, socket.MSG_WAITALL)
    if len(data) == size:
        return data
    parts, received = [data], len(data)  # a signal cut the wait short: the rest, then one join
    while received < size:
        part = bulk.recv(size - received, socket.MSG_WAITALL)
        if not part:
            raise EOFError("the other end closed mid-message")
        parts.append(part)
        received += len(part)
    return b"".join(parts)


class AnswerRenderer:
    """The child process and the turns that feed it (one per gateway process: RENDERER)."""

    def __init__(self, waiting_per_owner: int = WAITING_PER_OWNER):
        self.waiting_per_owner = waiting_per_owner
        self.turns = LargeBodyTurns(waiting_per_owner=None, rest_ratio=0.0, name="sluice-large-answers")
        self.child: multiprocessing.process.BaseProcess | None = None
        self._connection: Connection | None = None
        self._bulk: socket.socket | None = None  # the same socket, for the bytes (bulk_socket)

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
        light = [dataclasses.replace(result, pieces=[], line_bytes=0) for result in results]
        sizes = [sum(map(len, result.pieces)) for result in results]
        for tries_left in (1, 0):
            connection, bulk = self._started()
            try:
                connection.send((dialect, parsed, light, sizes, meta))
                for result in results:
                    for piece in result.pieces:  # as they came: joined, they would be copied holding the GIL
                        bulk.sendall(piece)
                verdict, detail = connection.recv()
                if verdict == "ok":
                    return receive_exactly(bulk, detail)
            except (EOFError, OSError):
                self.close()
                if not tries_left:
                    break
                continue
            if verdict == "unreadable":
                raise msgspec.DecodeError(detail)
            raise RuntimeError(f"rendering an answer failed in the render process: {detail}")
        raise Unavailable("the gateway could not render this answer now (its render process stopped); retry")

    def _started(self) -> tuple[Connection, socket.socket]:
        if self._connection is None or self._bulk is None or self.child is None or not self.child.is_alive():
            self.close()
            self._connection, self.child = start_function_process(_serve, "sluice-render")
            self._bulk = bulk_socket(self._connection)
        return self._connection, self._bulk

    def close(self) -> None:
        """Stop the child (it exits when its end of the pipe closes; a stuck one is killed)."""
        connection, bulk, child = self._connection, self._bulk, self.child
        self._connection, self._bulk, self.child = None, None, None
        if bulk is not None:
            bulk.close()
        if connection is not None:
            connection.close()
        if child is not None:
            stop_function_process(child, STOP_S)


RENDERER = AnswerRenderer()  # one child per gateway process
