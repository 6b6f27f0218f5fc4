"""Batches and their lines in the database (schema.py), per team: another team's batch is as unknown as one
that never existed.

A line is `pending` until a runner claims it (`running`, with its owner and a lease that the owner renews while
the line runs); its result is written once, by the owner of its lease, in the same transaction that ends the
line (`succeeded` or `errored`), so a result can be written only once for each (batch, line). A runner that dies
leaves its lines `running` until their leases expire; then any runner claims them again. On PostgreSQL a claim
is `FOR UPDATE SKIP LOCKED`: two gateways never claim the same line at once; SQLite's one writer serialises them
(storage/sql_text.py drops the row lock there). Lines of a cancelled batch that never started end `cancelled`, those
of a batch past its window `expired`. A batch is `validating` while its lines are written (a group per transaction),
then `in_progress`."""

from __future__ import annotations

import asyncio
import builtins
import secrets
import time
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass

import msgspec

import storage
from common.errors import BadRequest
from gateway.batches.lines import Checked, Line, encoded
from gateway.batches.schema import SCHEMA
from storage import Database

ACTIVE = ("in_progress", "finalizing", "cancelling")  # statuses whose lines may still change
HOLDING = ("validating", *ACTIVE)  # statuses whose lines count against the team's enqueued-token limit
ENDED_LINES = ("succeeded", "errored", "cancelled", "expired")
WINDOW_S = 86_400.0  # "24h", the one completion window both APIs offer


class EnqueuedTokensExceeded(BadRequest):
    """The team's unfinished batches already hold its enqueued-token limit: a 400 as OpenAI's
    `token_limit_exceeded` (it frees up as batches end, not by retrying)."""

    code = "token_limit_exceeded"


@dataclass
class Batch:
    id: str
    team_id: str
    api: str
    endpoint: str
    input_file_id: str | None
    status: str
    principal: str
    metadata: dict | None
    errors: dict | None
    times: dict[str, float | None]
    output_file_id: str | None
    error_file_id: str | None
    total: int
    model: str = ""


TIMES = ("created_at", "expires_at", "in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at",
         "cancelling_at", "cancelled_at")
COLUMNS = ("id, team_id, api, endpoint, input_file_id, status, principal, metadata, errors, "
           + ", ".join(TIMES) + ", output_file_id, error_file_id, total, model")


def _batch(row: tuple) -> Batch:
    (batch_id, team, api, endpoint, input_file, status, principal, metadata, errors, *rest) = row
    times = dict(zip(TIMES, rest[:len(TIMES)]))
    output_file, error_file, total, model = rest[len(TIMES):]
    return Batch(batch_id, team, api, endpoint, input_file, status, principal,
                 msgspec.json.decode(metadata) if metadata else None, msgspec.json.decode(errors) if errors else None,
                 times, output_file, error_file, int(total), model)


@dataclass
class Counts:
    pending: int = 0
    running: int = 0
    succeeded: int = 0
    errored: int = 0
    cancelled: int = 0
    expired: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def unfinished(self) -> int:
        return self.pending + self.running


@dataclass(frozen=True)
class Claimed:
    batch_id: str
    index: int
    custom_id: str
    body: dict


class BatchStore:
    def __init__(self, db: Database, team_max_enqueued_tokens: int) -> None:
        self.db = db
        self.team_max_enqueued_tokens = team_max_enqueued_tokens
        self.migrated = storage.MigratedOnFirstUse(db, SCHEMA)

    async def create(self, team_id: str, api: str, endpoint: str, input_file_id: str | None, principal: str,
                     metadata: dict | None, checked: Checked,
                     groups: AsyncIterable[builtins.list[Line]] | None = None) -> Batch:
        """With `checked.errors`, a batch that failed at once; else one of the lines `groups` yields (those `checked`
        kept where None), `in_progress` once all are written. They are written a group per transaction under a
        `validating` batch, so neither the input nor the database's writer is held for a whole file; a batch left
        `validating` by a gateway that died is failed by `fail_stale`."""
        db = await self.migrated()
        prefix = "msgbatch_" if api == "anthropic" else "batch_"
        batch_id = prefix + secrets.token_hex(12)
        now = time.time()
        errors = checked.errors
        async with db.transaction(lock=f"batches:{team_id}") as tx:  # no two creates pass the enqueued-token limit
            if not errors:
                summed = await tx.fetchone(
                    "SELECT COALESCE(SUM(enqueued_tokens), 0) FROM batches WHERE team_id = ? AND status IN "
                    "(?, ?, ?, ?)", (team_id, *HOLDING))
                assert summed is not None  # an aggregate without GROUP BY always returns one row
                (held,) = summed
                if int(held) + checked.tokens > self.team_max_enqueued_tokens:
                    raise EnqueuedTokensExceeded(
                        f"Enqueued token limit reached: your team's unfinished batches hold about {int(held)} tokens "
                        f"and this batch about {checked.tokens}; the limit is {self.team_max_enqueued_tokens}. Wait "
                        "for batches to finish, or cancel some.", param="input_file_id")
            await tx.execute(
                "INSERT INTO batches (id, team_id, api, endpoint, input_file_id, status, principal, metadata, errors, "
                "created_at, expires_at, failed_at, total, enqueued_tokens, model) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (batch_id, team_id, api, endpoint, input_file_id, "failed" if errors else "validating", principal,
                 encoded(metadata) if metadata is not None else None,
                 encoded({"object": "list", "data": errors}) if errors else None, now, now + WINDOW_S,
                 now if errors else None, 0 if errors else checked.total, 0 if errors else checked.tokens,
                 checked.model))
        if not errors:
            try:
                await self._write_lines(batch_id, checked, groups)
            except BaseException:
                await asyncio.shield(self._drop(batch_id))  # a create cut short (a client gone) leaves nothing
                raise
        found = await self.get(team_id, api, batch_id)
        assert found is not None
        return found

    async def _write_lines(self, batch_id: str, checked: Checked,
                           groups: AsyncIterable[builtins.list[Line]] | None) -> None:
        db = await self.migrated()
        written = 0
        async for group in groups if groups is not None else _once(checked.lines):
            if group:
                async with db.transaction() as tx:
                    await tx.executemany(
                        "INSERT INTO batch_lines (batch_id, idx, custom_id, body, state) "
                        "VALUES (?, ?, ?, ?, 'pending')",
                        [(batch_id, written + n, line.custom_id, encoded(line.body)) for n, line in enumerate(group)])
                written += len(group)
        if written != checked.total:  # its input read differently the second time: never run half a batch
            raise RuntimeError(f"batch {batch_id}: {written} lines written of {checked.total} checked")
        await self.mark(batch_id, "in_progress", "in_progress_at", expected=("validating",))

    async def _drop(self, batch_id: str) -> None:
        """A batch and its lines gone, in one transaction."""
        db = await self.migrated()
        async with db.transaction() as tx:
            await tx.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
            await tx.execute("DELETE FROM batches WHERE id = ?", (batch_id,))

    async def fail_stale(self, before: float) -> int:
        """Batches still `validating` that were created before `before`: their gateway died while writing their
        lines. Each ends `failed` with no line (the client asks again)."""
        db = await self.migrated()
        rows = await db.fetchall("SELECT id FROM batches WHERE status = 'validating' AND created_at < ?", (before,))
        errors = encoded({"object": "list", "data": [{
            "code": "validation_interrupted", "line": None, "param": None,
            "message": "The gateway that was checking this batch's input stopped; create the batch again."}]})
        for (batch_id,) in rows:
            async with db.transaction() as tx:
                await tx.execute("DELETE FROM batch_lines WHERE batch_id = ?", (batch_id,))
                await tx.execute("UPDATE batches SET status = 'failed', failed_at = ?, errors = ?, total = 0 "
                                 "WHERE id = ? AND status = 'validating'", (time.time(), errors, batch_id))
        return len(rows)

    async def get(self, team_id: str, api: str, batch_id: str) -> Batch | None:
        db = await self.migrated()
        row = await db.fetchone(f"SELECT {COLUMNS} FROM batches WHERE id = ? AND team_id = ? AND api = ?",
                                (batch_id, team_id, api))
        return _batch(row) if row is not None else None

    async def by_id(self, batch_id: str) -> Batch | None:
        db = await self.migrated()
        row = await db.fetchone(f"SELECT {COLUMNS} FROM batches WHERE id = ?", (batch_id,))
        return _batch(row) if row is not None else None

    async def list(self, team_id: str, api: str, after: str | None, before: str | None,
                   limit: int) -> tuple[list[Batch], bool]:
        """Newest first; `after`: those older than that batch, `before`: newer (Anthropic's paging)."""
        db = await self.migrated()
        sql = f"SELECT {COLUMNS} FROM batches WHERE team_id = ? AND api = ?"
        args: builtins.list[object] = [team_id, api]
        order = "DESC"
        for anchor_id, sign in ((after, "<"), (before, ">")):
            if anchor_id is None:
                continue
            anchor = await self.get(team_id, api, anchor_id)
            if anchor is not None:
                created = anchor.times["created_at"]
                sql += f" AND (created_at {sign} ? OR (created_at = ? AND id {sign} ?))"
                args += [created, created, anchor.id]
            if sign == ">":
                order = "ASC"
        rows = await db.fetchall(f"{sql} ORDER BY created_at {order}, id {order} LIMIT ?", (*args, limit + 1))
        batches = [_batch(row) for row in rows[:limit]]
        if order == "ASC":
            batches.reverse()
        return batches, len(rows) > limit

    async def all_of_team(self, team_id: str, limit: int) -> builtins.list[Batch]:
        db = await self.migrated()
        rows = await db.fetchall(f"SELECT {COLUMNS} FROM batches WHERE team_id = ? ORDER BY created_at DESC LIMIT ?",
                                 (team_id, limit))
        return [_batch(row) for row in rows]

    async def counts(self, batch_id: str) -> Counts:
        db = await self.migrated()
        rows = await db.fetchall("SELECT state, COUNT(*), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM("
                                 "completion_tokens), 0) FROM batch_lines WHERE batch_id = ? GROUP BY state",
                                 (batch_id,))
        counts = Counts()
        for state, count, prompt, completion in rows:
            setattr(counts, state, int(count))
            counts.prompt_tokens += int(prompt)
            counts.completion_tokens += int(completion)
        return counts

    async def cancel(self, batch: Batch) -> None:
        """in_progress -> cancelling: lines not yet claimed end `cancelled`; those running finish."""
        db = await self.migrated()
        now = time.time()
        async with db.transaction() as tx:
            await tx.execute("UPDATE batches SET status = 'cancelling', cancelling_at = ? WHERE id = ? AND "
                             "status = 'in_progress'", (now, batch.id))
            await tx.execute("UPDATE batch_lines SET state = 'cancelled' WHERE batch_id = ? AND state = 'pending'",
                             (batch.id,))

    async def delete(self, batch: Batch) -> None:
        await self._drop(batch.id)

    async def active(self) -> builtins.list[Batch]:
        db = await self.migrated()
        rows = await db.fetchall(f"SELECT {COLUMNS} FROM batches WHERE status IN (?, ?, ?) ORDER BY created_at",
                                 ACTIVE)
        return [_batch(row) for row in rows]

    async def claim(self, batch_id: str, owner: str, lease_s: float) -> Claimed | None:
        """The next line of the batch no live lease holds, now leased to `owner`."""
        db = await self.migrated()
        now = time.time()
        async with db.transaction() as tx:
            row = await tx.fetchone(
                "SELECT idx, custom_id, body FROM batch_lines WHERE batch_id = ? AND (state = 'pending' OR "
                "(state = 'running' AND lease_until < ?)) ORDER BY idx LIMIT 1 FOR UPDATE SKIP LOCKED", (batch_id, now))
            if row is None:
                return None
            await tx.execute("UPDATE batch_lines SET state = 'running', owner = ?, lease_until = ? "
                             "WHERE batch_id = ? AND idx = ?", (owner, now + lease_s, batch_id, row[0]))
        return Claimed(batch_id, int(row[0]), row[1], msgspec.json.decode(row[2]))

    async def renew(self, owner: str, lines: builtins.list[tuple[str, int]], lease_s: float) -> None:
        if not lines:
            return
        db = await self.migrated()
        async with db.transaction() as tx:
            await tx.executemany("UPDATE batch_lines SET lease_until = ? WHERE batch_id = ? AND idx = ? AND "
                                 "owner = ? AND state = 'running'",
                                 [(time.time() + lease_s, batch_id, index, owner) for batch_id, index in lines])

    async def finish(self, line: Claimed, owner: str, state: str, status_code: int | None, result: dict | None,
                     prompt_tokens: int = 0, completion_tokens: int = 0) -> bool:
        """The line's result, written once: only while `owner` still holds it. False: another runner did."""
        db = await self.migrated()
        async with db.transaction() as tx:
            held = await tx.fetchone("SELECT 1 FROM batch_lines WHERE batch_id = ? AND idx = ? AND owner = ? AND "
                                     "state = 'running'", (line.batch_id, line.index, owner))
            if held is None:
                return False
            await tx.execute("UPDATE batch_lines SET state = ?, status_code = ?, result = ?, prompt_tokens = ?, "
                             "completion_tokens = ?, lease_until = NULL WHERE batch_id = ? AND idx = ?",
                             (state, status_code, encoded(result) if result is not None else None, prompt_tokens,
                              completion_tokens, line.batch_id, line.index))
        return True

    async def release(self, line: Claimed, owner: str) -> None:
        """Give a line back unrun (its endpoint refused it for now): any runner takes it again later."""
        db = await self.migrated()
        async with db.transaction() as tx:
            await tx.execute("UPDATE batch_lines SET state = 'pending', owner = NULL, lease_until = NULL "
                             "WHERE batch_id = ? AND idx = ? AND owner = ? AND state = 'running'",
                             (line.batch_id, line.index, owner))

    async def purge_ended(self, before: float) -> int:
        """Delete ended batches created before `before` with their lines (their files expire on their own)."""
        db = await self.migrated()
        rows = await db.fetchall("SELECT id FROM batches WHERE created_at < ? AND status NOT IN (?, ?, ?, ?)",
                                 (before, *HOLDING))
        for (batch_id,) in rows:
            await self._drop(batch_id)
        return len(rows)

    async def release_all(self, owner: str) -> None:
        """A stopping runner gives back every line it holds: another start takes them at once."""
        db = await self.migrated()
        async with db.transaction() as tx:
            await tx.execute("UPDATE batch_lines SET state = 'pending', owner = NULL, lease_until = NULL "
                             "WHERE owner = ? AND state = 'running'", (owner,))

    async def expire(self, batch: Batch) -> None:
        """Past the window: lines not claimed (or whose lease lapsed) end `expired`."""
        db = await self.migrated()
        async with db.transaction() as tx:
            await tx.execute("UPDATE batch_lines SET state = 'expired' WHERE batch_id = ? AND (state = 'pending' OR "
                             "(state = 'running' AND lease_until < ?))", (batch.id, time.time()))

    async def results(self, batch_id: str, after: int, limit: int) -> builtins.list[tuple]:
        """(idx, custom_id, state, status_code, result) of ended lines, in order, from line `after` on."""
        db = await self.migrated()
        return await db.fetchall(
            "SELECT idx, custom_id, state, status_code, result FROM batch_lines WHERE batch_id = ? AND idx >= ? "
            "AND state IN (?, ?, ?, ?) ORDER BY idx LIMIT ?", (batch_id, after, *ENDED_LINES, limit))

    async def mark(self, batch_id: str, status: str, stamp: str | None, *, expected: tuple[str, ...],
                   output_file_id: str | None = None, error_file_id: str | None = None) -> bool:
        """Move a batch to `status` (stamping `stamp`) if it is in one of `expected`."""
        db = await self.migrated()
        marks = "?, " * (len(expected) - 1) + "?"
        async with db.transaction() as tx:
            found = await tx.fetchone(f"SELECT 1 FROM batches WHERE id = ? AND status IN ({marks})",
                                      (batch_id, *expected))
            if found is None:
                return False
            sets: builtins.list[str] = ["status = ?"]
            args: builtins.list[object] = [status]
            if stamp is not None:
                sets.append(f"{stamp} = ?")
                args.append(time.time())
            if output_file_id is not None:
                sets.append("output_file_id = ?")
                args.append(output_file_id)
            if error_file_id is not None:
                sets.append("error_file_id = ?")
                args.append(error_file_id)
            await tx.execute(f"UPDATE batches SET {', '.join(sets)} WHERE id = ?", (*args, batch_id))
        return True


async def _once(lines: builtins.list[Line]) -> AsyncIterator[builtins.list[Line]]:
    yield lines
