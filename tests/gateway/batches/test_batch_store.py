"""The batch tables on both databases (SQLite, PostgreSQL): lines claimed once however many runners claim
together (PostgreSQL: FOR UPDATE SKIP LOCKED), a lapsed lease claimed again, a result written only by the holder
of the line's lease, cancel and expiry of unclaimed lines, the per-team enqueued-token limit, and another team's
batch unknown (gateway/batches/store.py)."""

from __future__ import annotations

import asyncio
import time
import tracemalloc

import pytest

import storage
from gateway.batches.lines import Checked, OpenAIFile, anthropic_requests, estimated_tokens
from gateway.batches.store import BatchStore, Counts, EnqueuedTokensExceeded


def lines(count: int) -> Checked:
    checked = Checked()
    for i in range(count):
        checked.add(i, f"c{i}", {"model": "m", "max_tokens": 4, "messages": []})
    return checked


async def test_claims_are_exclusive_and_results_written_once(store_url):
    db = await storage.open(store_url)
    try:
        store = BatchStore(db, 10_000_000)
        batch = await store.create("team_a", "openai", "/v1/chat/completions", None, "{}", None, lines(30))
        assert await store.get("team_b", "openai", batch.id) is None  # another team's batch is unknown
        assert await store.get("team_a", "anthropic", batch.id) is None
        claims = await asyncio.gather(*(store.claim(batch.id, f"runner-{n % 3}", 60) for n in range(40)))
        claimed = [c for c in claims if c is not None]
        assert sorted(c.index for c in claimed) == list(range(30))  # each line once, none left out
        owner = {c.index: f"runner-{n % 3}" for n, c in enumerate(claims) if c is not None}
        first = claimed[0]
        assert not await store.finish(first, "someone-else", "succeeded", 200, {"ok": 1})
        assert await store.finish(first, owner[first.index], "succeeded", 200, {"ok": 1}, 3, 4)
        assert not await store.finish(first, owner[first.index], "errored", 500, {"late": 1})  # written once
        counts = await store.counts(batch.id)
        assert (counts.succeeded, counts.running, counts.prompt_tokens, counts.completion_tokens) == (1, 29, 3, 4)
        [(_, custom_id, state, status, result)] = await store.results(batch.id, 0, 10)
        assert (custom_id, state, status, result) == (first.custom_id, "succeeded", 200, '{"ok":1}')
    finally:
        await db.close()


async def test_a_lapsed_lease_is_claimed_again_and_its_first_owner_cannot_write(store_url):
    db = await storage.open(store_url)
    try:
        store = BatchStore(db, 10_000_000)
        batch = await store.create("team_a", "openai", "/v1/chat/completions", None, "{}", None, lines(1))
        dead = await store.claim(batch.id, "dead", 0.05)
        assert await store.claim(batch.id, "alive", 60) is None  # held while the lease lives
        await asyncio.sleep(0.1)
        again = await store.claim(batch.id, "alive", 60)
        assert again is not None and again.index == dead.index
        assert not await store.finish(dead, "dead", "succeeded", 200, {})
        assert await store.finish(again, "alive", "succeeded", 200, {})
        await store.release(again, "alive")  # a finished line is not given back
        assert (await store.counts(batch.id)).succeeded == 1
    finally:
        await db.close()


async def test_cancel_expiry_and_the_enqueued_token_limit(store_url):
    db = await storage.open(store_url)
    try:
        cost = sum(estimated_tokens(line.body) for line in lines(10).lines)
        store = BatchStore(db, cost * 2)
        made = [await store.create("team_a", "openai", "/v1/completions", None, "{}", None, lines(10))
                for _ in range(2)]
        with pytest.raises(EnqueuedTokensExceeded):
            await store.create("team_a", "openai", "/v1/completions", None, "{}", None, lines(10))
        await store.create("team_b", "openai", "/v1/completions", None, "{}", None, lines(10))  # its own
        running = await store.claim(made[0].id, "r", 60)
        await store.cancel(made[0])
        counts = await store.counts(made[0].id)
        assert (counts.cancelled, counts.running) == (9, 1)
        assert await store.mark(made[0].id, "cancelled", "cancelled_at", expected=("cancelling",))
        assert running is not None
        await store.expire(made[1])
        assert (await store.counts(made[1].id)).expired == 10
        assert await store.mark(made[1].id, "expired", "expired_at", expected=("in_progress",))
        await store.create("team_a", "openai", "/v1/completions", None, "{}", None, lines(10))  # room again
        refused = Checked()
        refused.error(1, "x", "y")
        failed = await store.create("team_a", "openai", "/v1/completions", None, "{}", None, refused)
        assert failed.status == "failed" and failed.errors["data"][0]["code"] == "x"
        newest, more = await store.list("team_a", "openai", None, None, 2)
        assert more and [b.id for b in newest][0] == failed.id
        older, _ = await store.list("team_a", "openai", newest[-1].id, None, 10)
        assert {b.id for b in older}.isdisjoint(b.id for b in newest)
        assert time.time() < made[0].times["expires_at"] <= time.time() + 86_400
        assert await store.purge_ended(time.time() + 1) == 3  # the ended ones (cancelled, expired, failed)
        assert await store.get("team_a", "openai", made[0].id) is None and await store.counts(made[0].id) == Counts()
        assert await store.get("team_a", "openai", newest[-1].id) is not None  # in progress: kept
    finally:
        await db.close()


def file_checked(raw: bytes, max_lines: int, cuts: tuple[int, ...] = ()) -> tuple[Checked, list[str]]:
    """A file's checks and the custom_ids of the lines it gives, its bytes fed in pieces cut at `cuts`."""
    check = OpenAIFile("/v1/completions", max_lines)
    edges = [0, *cuts, len(raw)]
    given = [line for start, end in zip(edges, edges[1:]) for line in check.feed(raw[start:end])]
    given += check.finish()
    return check.checked, [line.custom_id for line in given]


def test_input_checks_name_each_line():
    raw = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m"}}\n' \
          b'[1]\n\n{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m"}}\n' \
          + b'[' * 100 + b'\n'
    checked, _ = file_checked(raw, 100)
    assert [(e["line"], e["code"]) for e in checked.errors] == [
        (2, "invalid_json_line"), (3, "invalid_json_line"), (4, "duplicate_custom_id"), (5, "invalid_json_line")]
    too_many, _ = file_checked(raw * 30, 100)
    assert [(e["code"], e["message"][-10:]) for e in too_many.errors] == [("too_many_requests", "150 lines.")]
    assert [e["code"] for e in file_checked(b"", 10)[0].errors] == ["empty_file"]
    assert anthropic_requests([], 10).errors[0]["param"] == "requests"
    assert anthropic_requests([{"custom_id": "x", "params": {"model": "m"}}] * 11, 10).errors
    assert [e["line"] for e in anthropic_requests([{"custom_id": "x", "params": {"model": "m"}}, 5], 10).errors] == [1]


LINES = b"".join(b'{"custom_id": "c%d", "method": "POST", "url": "/v1/completions", "body": {"model": "m%d"}}\r\n'
                 % (n, n // 3) for n in range(7))


@pytest.mark.parametrize("cuts", [(), (1,), (5, 90, 91), tuple(range(1, len(LINES), 17)), tuple(range(1, len(LINES)))])
def test_a_file_checks_alike_however_its_pieces_fall(cuts):
    whole, ids = file_checked(LINES + b"no json", 100)
    checked, pieces_ids = file_checked(LINES + b"no json", 100, cuts)
    assert (checked.errors, checked.total, checked.tokens, pieces_ids) == (whole.errors, whole.total, whole.tokens,
                                                                          ids)
    assert ids == [f"c{n}" for n in range(7)] and [e["code"] for e in whole.errors] == ["invalid_json_line",
                                                                                          "mismatched_model"]


def test_a_file_is_checked_in_the_memory_of_one_piece():
    """A 16 MiB file through the checker: what it allocates at once stays near one 1 MiB piece (the old check
    held the whole file, then every line parsed)."""
    line = b'{"custom_id": "c%08d", "method": "POST", "url": "/v1/completions", "body": {"model": "m", ' \
           b'"prompt": "' + b"x" * 900 + b'"}}\n'
    check = OpenAIFile("/v1/completions", 1_000_000)
    piece = b"".join(line % n for n in range(1_000))  # ~1 MiB: bodies.CHUNK
    tracemalloc.start()
    try:
        for round_ in range(16):
            check.feed(piece.replace(b'"c0', b'"%x' % round_))
        check.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert check.checked.total == 16_000 and not check.checked.errors
    assert peak < 8 << 20


async def _groups(checked: Checked, fail_after: int | None = None):
    for start in range(0, len(checked.lines), 4):
        if fail_after is not None and start >= fail_after:
            raise OSError("the input could not be read")
        yield checked.lines[start:start + 4]


async def test_lines_are_written_in_groups_under_a_validating_batch_that_a_failure_leaves_nothing_of(store_url):
    db = await storage.open(store_url)
    try:
        input_ = lines(10)
        store = BatchStore(db, 10_000_000)
        batch = await store.create("team_a", "openai", "/v1/completions", "file-x", "{}", None, input_,
                                   _groups(input_))
        assert batch.status == "in_progress" and batch.times["in_progress_at"] is not None
        assert [row[1] for row in await db.fetchall("SELECT idx, custom_id FROM batch_lines WHERE batch_id = ? "
                                                    "ORDER BY idx", (batch.id,))] == [f"c{i}" for i in range(10)]
        with pytest.raises(OSError):
            await store.create("team_a", "openai", "/v1/completions", "file-x", "{}", None, input_,
                               _groups(input_, fail_after=4))
        short = lines(10)
        short.lines = short.lines[:6]  # a file that read differently the second time
        with pytest.raises(RuntimeError):
            await store.create("team_a", "openai", "/v1/completions", "file-x", "{}", None, short, _groups(short))
        assert [b.id for b in (await store.list("team_a", "openai", None, None, 10))[0]] == [batch.id]
        assert (await db.fetchone("SELECT COUNT(*) FROM batch_lines"))[0] == 10
    finally:
        await db.close()


async def test_a_batch_left_validating_by_a_dead_gateway_holds_its_tokens_then_fails(store_url):
    db = await storage.open(store_url)
    try:
        input_ = lines(10)
        store = BatchStore(db, input_.tokens * 2 - 1)
        created = asyncio.get_running_loop().create_future()

        async def then_die():
            yield input_.lines[:4]
            created.set_result(None)
            await asyncio.Event().wait()  # the gateway dies here: its task never goes on

        dying = asyncio.create_task(store.create("team_a", "openai", "/v1/completions", None, "{}", None, input_,
                                                 then_die()))
        await created
        with pytest.raises(EnqueuedTokensExceeded):  # the validating batch holds its tokens
            await store.create("team_a", "openai", "/v1/completions", None, "{}", None, lines(10))
        [validating] = (await store.list("team_a", "openai", None, None, 10))[0]
        assert validating.status == "validating"
        assert await store.fail_stale(time.time() - 3_600) == 0  # young: another gateway may be writing it
        assert await store.fail_stale(time.time() + 1) == 1
        stale = await store.get("team_a", "openai", validating.id)
        assert stale.status == "failed" and stale.errors["data"][0]["code"] == "validation_interrupted"
        assert await store.counts(validating.id) == Counts()
        await store.create("team_a", "openai", "/v1/completions", None, "{}", None, lines(10))  # room again
        dying.cancel()
        with pytest.raises(asyncio.CancelledError):
            await dying
    finally:
        await db.close()
