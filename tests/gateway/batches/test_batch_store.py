"""The batch tables on both databases (SQLite, PostgreSQL): lines claimed once however many runners claim
together (PostgreSQL: FOR UPDATE SKIP LOCKED), a lapsed lease claimed again, a result written only by the holder
of the line's lease, cancel and expiry of unclaimed lines, the per-team enqueued-token limit, and another team's
batch unknown (gateway/batches/store.py)."""

from __future__ import annotations

import asyncio
import time

import pytest

import storage
from gateway.batches.lines import Line, anthropic_requests, estimated_tokens, openai_file
from gateway.batches.store import BatchStore, Counts, EnqueuedTokensExceeded


def lines(count: int) -> list[Line]:
    return [Line(f"c{i}", {"model": "m", "max_tokens": 4, "messages": []}, "m") for i in range(count)]


async def test_claims_are_exclusive_and_results_written_once(store_url):
    db = await storage.open(store_url)
    try:
        store = BatchStore(db, 10_000_000)
        batch = await store.create("team_a", "openai", "/v1/chat/completions", None, "{}", None, lines(30), None)
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
        batch = await store.create("team_a", "openai", "/v1/chat/completions", None, "{}", None, lines(1), None)
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
        cost = sum(estimated_tokens(line.body) for line in lines(10))
        store = BatchStore(db, cost * 2)
        made = [await store.create("team_a", "openai", "/v1/completions", None, "{}", None, lines(10), None)
                for _ in range(2)]
        with pytest.raises(EnqueuedTokensExceeded):
            await store.create("team_a", "openai", "/v1/completions", None, "{}", None, lines(10), None)
        await store.create("team_b", "openai", "/v1/completions", None, "{}", None, lines(10), None)  # its own
        running = await store.claim(made[0].id, "r", 60)
        await store.cancel(made[0])
        counts = await store.counts(made[0].id)
        assert (counts.cancelled, counts.running) == (9, 1)
        assert await store.mark(made[0].id, "cancelled", "cancelled_at", expected=("cancelling",))
        assert running is not None
        await store.expire(made[1])
        assert (await store.counts(made[1].id)).expired == 10
        assert await store.mark(made[1].id, "expired", "expired_at", expected=("in_progress",))
        await store.create("team_a", "openai", "/v1/completions", None, "{}", None, lines(10), None)  # room again
        failed = await store.create("team_a", "openai", "/v1/completions", None, "{}", None, [],
                                    [{"code": "x", "message": "y", "param": None, "line": 1}])
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


def test_input_checks_name_each_line():
    raw = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m"}}\n' \
          b'[1]\n\n{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m"}}\n' \
          + b'[' * 100 + b'\n'
    checked = openai_file(raw, "/v1/completions", 100)
    assert [(e["line"], e["code"]) for e in checked.errors] == [
        (2, "invalid_json_line"), (3, "invalid_json_line"), (4, "duplicate_custom_id"), (5, "invalid_json_line")]
    assert [e["code"] for e in openai_file(raw * 30, "/v1/completions", 100).errors] == ["too_many_requests"]
    assert anthropic_requests([], 10).errors[0]["param"] == "requests"
    assert anthropic_requests([{"custom_id": "x", "params": {"model": "m"}}] * 11, 10).errors
    assert [e["line"] for e in anthropic_requests([{"custom_id": "x", "params": {"model": "m"}}, 5], 10).errors] == [1]
