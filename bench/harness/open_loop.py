"""An open-loop load generator: requests leave on a fixed schedule (`rate` per second) whatever the server
does, and each latency counts from the moment its request was due, not from when a connection was free, so a
server that falls behind shows its queueing (no coordinated omission, unlike a closed loop such as wrk).

Why not wrk2 (the open-loop wrk): Debian does not package it. This one is asyncio + uvloop on raw keep-alive
sockets with httptools' parser, so it also timestamps every streamed event (inter-token gaps). It shares the
machine's cores with the server it measures; its schedule lag is reported so a saturated generator shows.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from dataclasses import dataclass, field

import httptools

MAX_CONNECTIONS = 4096


@dataclass
class OpenLoopResult:
    sent: int
    ok: int
    errors: int
    duration_s: float
    latencies_s: list[float] = field(default_factory=list)
    gaps_s: list[float] = field(default_factory=list)  # between successive reads that carried stream events
    max_lag_s: float = 0.0  # how late the generator itself sent its most delayed request
    failures: Counter = field(default_factory=Counter)  # what the errors were: "status 503", "OSError", ...

    @property
    def rps(self) -> float:
        return self.ok / self.duration_s if self.duration_s else 0.0


class _Response:
    def __init__(self) -> None:
        self.complete = False
        self.event_times: list[float] = []

    def on_body(self, body: bytes) -> None:
        if b"data:" in body or b"\n" in body:
            self.event_times.append(time.perf_counter())

    def on_message_complete(self) -> None:
        self.complete = True


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def exchange(self, request: bytes) -> tuple[int, list[float], bool]:
        response = _Response()
        parser = httptools.HttpResponseParser(response)
        self.writer.write(request)
        while not response.complete:
            data = await self.reader.read(65536)
            if not data:
                raise ConnectionError("closed mid-response")
            parser.feed_data(data)
        return parser.get_status_code(), response.event_times, parser.should_keep_alive()


def encode_request(host: str, port: int, path: str, body: bytes, key: str) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n")
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    return head.encode() + b"\r\n" + body


async def run_open_loop(host: str, port: int, path: str, body: bytes, key: str, rate: float,
                        duration_s: float) -> OpenLoopResult:
    request = encode_request(host, port, path, body, key)
    idle: list[_Connection] = []
    open_count = 0
    result = OpenLoopResult(sent=0, ok=0, errors=0, duration_s=0.0)

    async def one(due: float) -> None:
        nonlocal open_count
        connection = idle.pop() if idle else None
        try:
            if connection is None:
                if open_count >= MAX_CONNECTIONS:
                    result.errors += 1
                    result.failures["no connection left"] += 1
                    return
                open_count += 1
                connection = _Connection(*await asyncio.open_connection(host, port))
            status, events, keep = await connection.exchange(request)
        except (OSError, ConnectionError, httptools.HttpParserError):
            result.errors += 1
            if connection is not None:
                open_count -= 1
                connection.writer.close()
            return
        done = time.perf_counter()
        if status == 200:
            result.ok += 1
            result.latencies_s.append(done - due)
            result.gaps_s.extend(b - a for a, b in itertools.pairwise(events))
        else:
            result.errors += 1
            result.failures[f"status {status}"] += 1
        if keep:
            idle.append(connection)
        else:
            open_count -= 1
            connection.writer.close()

    total = int(rate * duration_s)
    tasks = []
    started = time.perf_counter()
    for index in range(total):
        due = started + index / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            result.max_lag_s = max(result.max_lag_s, -delay)
        tasks.append(asyncio.create_task(one(due)))
        result.sent += 1
    _, late = await asyncio.wait(tasks, timeout=max(30.0, duration_s))
    result.duration_s = time.perf_counter() - started
    for task in late:  # still unanswered well after the schedule ended: counted as failures
        task.cancel()
    result.errors += len(late)
    if late:
        result.failures["unanswered 30 s after the schedule"] += len(late)
    for connection in idle:
        connection.writer.close()
    return result
