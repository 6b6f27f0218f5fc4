"""The batch runner, one per gateway: it claims batch lines (store.py) and runs them (line_run.py) on the
capacity interactive requests leave idle, finalizes batches whose lines all ended, expires those past their
window and purges expired files and the batches as old (with their lines).

The priority rule, per endpoint: a batch line starts only while
- nobody waits in the endpoint's activator queue (an interactive request waiting for a replica pauses batches),
- a ready replica has a free place: its in-flight count (interactive and batch) below both the activator's
  capacity (what it takes at once) and the endpoint's `target_concurrency` (the load the autoscaler aims for per
  replica, so batch lines alone never make it add replicas),
- and this gateway runs fewer than `[batches] in_flight_per_endpoint` lines on it.
An endpoint at zero replicas gets one line, which waits in its queue and wakes it like any request; once the
batch is done its idle timer takes it back to zero. A line the endpoint refuses for now (queue full, wait over)
goes back to pending and its endpoint is left alone for PAUSE_S. Between teams, turns go round robin: each
start goes to the team whose last start is oldest, and within a team to its oldest batch."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import math
import os
import secrets
import socket
import time
from collections import Counter

import msgspec
import structlog

from auth import Principal
from gateway.batches.files import FileStore
from gateway.batches.line_run import run_line
from gateway.batches.objects import anthropic_line, line_request_id, openai_line
from gateway.batches.store import Batch, BatchStore, Claimed, Counts
from gateway.config import BatchSettings
from gateway.endpoints.adapters import split_model
from gateway.errors import SluiceError
from gateway.lifecycle import Background
from gateway.serving.model_aliases import endpoint_named
from gateway.serving.services import Services

log = structlog.get_logger("gateway")
PAUSE_S = 5.0  # an endpoint that refused a line for now is left alone this long
VALIDATING_STALE_S = 3_600.0  # a create writes its lines in seconds; one validating this long lost its gateway
PURGE_EVERY_S = 300.0
STOP_S = 10.0  # a stop cancels the loop and the lines in flight: what they get to unwind (each gives its line back)
RESULT_PAGE = 1000
_json = msgspec.json.Encoder()


def produced_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's output or error file: the same at every finalization (written once)."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


class BatchRunner:
    def __init__(self, services: Services, store: BatchStore, files: FileStore, settings: BatchSettings) -> None:
        self.services, self.store, self.files, self.settings = services, store, files, settings
        self.owner = f"{socket.gethostname()[:64]}-{os.getpid()}-{secrets.token_hex(4)}"
        self.running: dict[tuple[str, int], str] = {}  # line -> the endpoint it runs on
        self.per_endpoint: Counter[str] = Counter()
        self.paused_until: dict[str, float] = {}
        self.turns = itertools.count(1)
        self.last_turn: dict[str, int] = {}
        self.wakeup = asyncio.Event()
        self._tasks = Background("batch runner")  # its loop and the lines it runs
        self._renewed = self._purged = 0.0

    def start(self) -> BatchRunner:
        self._tasks.spawn(self._loop(), name="batch-runner")
        return self

    async def stop(self) -> None:
        """Stop claiming; lines in flight are cancelled and given back (recorded nowhere: their next run is
        recorded, once)."""
        await self._tasks.stop(STOP_S)
        try:
            await self.store.release_all(self.owner)
        except SluiceError as error:  # the database is away: the leases lapse instead
            log.warning("batches.release_failed", error=error.message)

    def wake(self) -> None:
        self.wakeup.set()

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except SluiceError as error:  # the database is away: the next round tries again
                log.warning("batches.tick_failed", error=error.message)
            except Exception:  # a bug must not end the runner for good
                log.exception("batches.tick_failed")
            try:
                await asyncio.wait_for(self.wakeup.wait(), self.settings.poll_interval_s)
            except TimeoutError:
                pass
            self.wakeup.clear()

    async def tick(self) -> None:
        now = time.time()
        await self._renew(now)
        if now - self._purged > PURGE_EVERY_S:
            self._purged = now
            await self.files.purge_expired()
            await self.store.purge_ended(now - self.settings.file_retention_s)  # kept as long as their files
            await self.store.fail_stale(now - VALIDATING_STALE_S)
        startable: dict[str, list[Batch]] = {}
        for batch in await self.store.active():
            if batch.status in ("in_progress", "cancelling") and now >= (batch.times["expires_at"] or now):
                await self.store.expire(batch)
            counts = await self.store.counts(batch.id)
            if counts.unfinished == 0:
                await self.finalize(batch, counts)
            elif batch.status == "in_progress" and counts.pending + counts.running > 0:
                startable.setdefault(batch.team_id, []).append(batch)
        await self._dispatch(startable)

    async def _renew(self, now: float) -> None:
        if now - self._renewed >= self.settings.lease_s / 3:
            self._renewed = now
            await self.store.renew(self.owner, list(self.running), self.settings.lease_s)

    # ---- starting lines ----

    def _endpoint(self, batch: Batch, principal: Principal):
        try:
            endpoints = self.services.endpoints
            return endpoint_named(endpoints, split_model(batch.model, endpoints.controllers)[0], principal)
        except SluiceError:
            return None  # every line of it fails at once in `authorize`: it takes no capacity

    def _has_room(self, controller) -> bool:
        name = controller.name
        if self.per_endpoint[name] >= self.settings.in_flight_per_endpoint:
            return False
        if self.paused_until.get(name, 0.0) > time.monotonic():
            return False
        activator = controller.activator
        if activator.waiting:
            return False
        candidates = activator.pool.candidates()
        if not candidates:  # asleep or waking: one line wakes it and waits in its queue
            return self.per_endpoint[name] == 0
        # a replica's load as the autoscaler aims for it: batch lines never push one past it (no scale-up for them)
        room = min(activator.capacity, math.ceil(controller.spec.target_concurrency))
        return any(replica.in_flight < room for replica in candidates)

    async def _dispatch(self, startable: dict[str, list[Batch]]) -> None:
        principals: dict[str, Principal] = {}
        progress = True
        while progress and startable:
            progress = False
            for team in sorted(startable, key=lambda t: self.last_turn.get(t, 0)):
                for batch in list(startable[team]):
                    principal = principals.get(batch.id)
                    if principal is None:
                        principal = principals[batch.id] = msgspec.json.decode(batch.principal, type=Principal)
                    controller = self._endpoint(batch, principal)
                    name = controller.name if controller is not None else ""
                    if controller is not None and not self._has_room(controller):
                        continue
                    if controller is None and self.per_endpoint[name] >= self.settings.in_flight_per_endpoint:
                        continue
                    line = await self.store.claim(batch.id, self.owner, self.settings.lease_s)
                    if line is None:
                        startable[team].remove(batch)
                        continue
                    self._start(batch, principal, line, name)
                    self.last_turn[team] = next(self.turns)
                    progress = True
                    break
                if not startable[team]:
                    del startable[team]
                if progress:
                    break

    def _start(self, batch: Batch, principal: Principal, line: Claimed, endpoint: str) -> None:
        key = (line.batch_id, line.index)
        self.running[key] = endpoint
        self.per_endpoint[endpoint] += 1
        self._tasks.spawn(self._run(batch, principal, line, endpoint), name=f"batch line {line.index}")

    async def _run(self, batch: Batch, principal: Principal, line: Claimed, endpoint: str) -> None:
        request_id = line_request_id(batch.id, batch.times["created_at"] or 0.0, line.index)
        try:
            outcome = await run_line(self.services, principal, batch.endpoint, line, request_id)
            if outcome.retry:
                self.paused_until[endpoint] = time.monotonic() + PAUSE_S
                await self.store.release(line, self.owner)
            else:
                state = "succeeded" if outcome.status_code == 200 else "errored"
                await self.store.finish(line, self.owner, state, outcome.status_code, outcome.body,
                                        outcome.prompt_tokens, outcome.completion_tokens)
        except SluiceError as error:  # the database is away: the lease lapses and the line runs again
            log.warning("batches.line_failed", batch_id=batch.id, line=line.index, error=error.message)
        except Exception:
            log.exception("batches.line_failed", batch_id=batch.id, line=line.index)
        finally:
            self.running.pop((line.batch_id, line.index), None)
            self.per_endpoint[endpoint] -= 1
            self.wake()

    # ---- ending batches ----

    async def finalize(self, batch: Batch, counts: Counts) -> None:
        """Every line ended: write the output and error files (OpenAI), then the batch's final status."""
        if batch.status == "in_progress":
            if not await self.store.mark(batch.id, "finalizing", "finalizing_at", expected=("in_progress",)):
                return
            batch.status = "finalizing"
        output_id = error_id = None
        if batch.api == "openai":
            output_id, error_id = await self._write_files(batch)
        if batch.status == "cancelling":
            final, stamp = "cancelled", "cancelled_at"
        elif counts.expired:
            final, stamp = "expired", "expired_at"
        else:
            final, stamp = "completed", "completed_at"
        if await self.store.mark(batch.id, final, stamp, expected=(batch.status,), output_file_id=output_id,
                                 error_file_id=error_id):
            log.info("batches.ended", batch_id=batch.id, status=final, succeeded=counts.succeeded,
                     errored=counts.errored, expired=counts.expired, cancelled=counts.cancelled)

    async def _write_files(self, batch: Batch) -> tuple[str | None, str | None]:
        output, errors = bytearray(), bytearray()
        after = 0
        while rows := await self.store.results(batch.id, after, RESULT_PAGE):
            for index, custom_id, state, status_code, result in rows:
                body = msgspec.json.decode(result) if result else None
                line = openai_line(batch, index, custom_id, state, status_code, body)
                (output if state == "succeeded" else errors).extend(_json.encode(line) + b"\n")
            after = rows[-1][0] + 1
        ids: list[str | None] = []
        for kind, body in (("output", output), ("error", errors)):
            if not body:
                ids.append(None)
                continue
            file_id = produced_file_id(batch.id, kind)
            await self.files.create(batch.team_id, "batch_output", f"{batch.id}_{kind}.jsonl", bytes(body),
                                    produced=True, file_id=file_id)
            ids.append(file_id)
        return ids[0], ids[1]


async def anthropic_results(store: BatchStore, batch: Batch):
    """Anthropic's results, one JSON line per request in order, read a page at a time."""
    after = 0
    while rows := await store.results(batch.id, after, RESULT_PAGE):
        yield b"".join(_json.encode(anthropic_line(custom_id, state, msgspec.json.decode(result) if result else None))
                       + b"\n" for _, custom_id, state, _, result in rows)
        after = rows[-1][0] + 1
