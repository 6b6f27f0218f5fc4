"""The ledger against both stores: durable, priced, idempotent, replayed at start."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest

from billing.ledger import Ledger
from billing.usage import UsageQuery
from billing.wal import list_segments, segment_path
from tests.billing.factory import usage

ALL_TIME = dict(start=0.0, end=4e9)


async def stored(ledger: Ledger, team_id: str | None = None):
    return {e.usage.request_id: e for e in await ledger.records(UsageQuery(team_id=team_id, **ALL_TIME))}


async def test_record_is_priced_and_shipped(ledger: Ledger):
    rec = usage(model="big", prompt_tokens=1000, completion_tokens=200, compute_tokens=600)
    await ledger.record(rec)
    await ledger.flush(10)
    entry = (await stored(ledger))[rec.request_id]
    assert entry.usage == rec
    assert (entry.input_price_micros, entry.output_price_micros) == (3_000_000, 15_000_000)
    # output billed on compute tokens: 1000*3 + 600*15 micro-units
    assert entry.cost_micros == 3_000 + 9_000


async def test_unknown_model_uses_default_price(ledger: Ledger):
    rec = usage(model="mystery", prompt_tokens=1_000_000, compute_tokens=1_000_000, completion_tokens=1)
    await ledger.record(rec)
    await ledger.flush(10)
    assert (await stored(ledger))[rec.request_id].cost_micros == 1_000 + 2_000


async def test_same_request_id_is_stored_once(ledger: Ledger):
    rec = usage()
    await asyncio.gather(*(ledger.record(rec) for _ in range(5)))
    await ledger.flush(10)
    await ledger.record(rec)
    await ledger.flush(10)
    assert (await ledger.store.count([rec.request_id])) == {rec.request_id: 1}
    report = await ledger.usage(UsageQuery(group_by="none", **ALL_TIME))
    assert report.totals.requests == 1


async def test_rejected_requests_count_with_zero_tokens(ledger: Ledger):
    from billing.records import UsageRecord

    plain = UsageRecord.rejected(request_id="rej-1", time=time.time(), team_id="team-a", key_id="key-1",
                                 user_id="u", model="small", dialect="openai", route="/v1/completions")
    sloppy = usage(request_id="rej-2", status="rejected", prompt_tokens=50, completion_tokens=3, compute_tokens=3)
    await ledger.record(plain)
    await ledger.record(sloppy)
    await ledger.record(usage(request_id="ok-1"))
    await ledger.flush(10)
    rows = await stored(ledger)
    for rid in ("rej-1", "rej-2"):
        u = rows[rid].usage
        assert (u.status, u.prompt_tokens, u.completion_tokens, u.compute_tokens, rows[rid].cost_micros) == (
            "rejected", 0, 0, 0, 0)
    totals = (await ledger.usage(UsageQuery(group_by="none", **ALL_TIME))).totals
    assert totals.requests == 3 and totals.prompt_tokens == 10


async def test_cancelled_stream_is_billed_for_generated_tokens(ledger: Ledger):
    rec = usage(status="cancelled", prompt_tokens=40, completion_tokens=17, compute_tokens=17, model="small")
    await ledger.record(rec)
    await ledger.flush(10)
    entry = (await stored(ledger))[rec.request_id]
    assert entry.usage.status == "cancelled" and entry.usage.completion_tokens == 17
    assert entry.cost_micros == (40 * 100_000 + 17 * 400_000 + 500_000) // 1_000_000


@pytest.mark.parametrize("bad", [dict(prompt_tokens=-1), dict(status="weird"), dict(completion_tokens=1.5),
                                 dict(team_id=None)])
async def test_malformed_record_is_refused_up_front(ledger: Ledger, bad):
    with pytest.raises(ValueError):
        await ledger.record(usage(**bad))
    await ledger.record(usage(request_id="after"))  # the log is not poisoned
    await ledger.flush(10)
    assert list(await stored(ledger)) == ["after"]


async def test_cancelled_caller_does_not_withdraw_record(ledger: Ledger):
    recs = [usage() for _ in range(50)]
    tasks = [asyncio.create_task(ledger.record(r)) for r in recs]
    await asyncio.sleep(0)  # appended, not yet committed
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await ledger.flush(10)
    assert set(await stored(ledger)) == {r.request_id for r in recs}


async def test_replay_at_open_and_twice_is_idempotent(database_url, wal_dir, pricing, tmp_path):
    led = await Ledger.open(database_url, wal_dir, pricing)
    recs = [usage() for _ in range(300)]
    await asyncio.gather(*(led.record(r) for r in recs))
    backup = tmp_path / "wal-copy"
    shutil.copytree(wal_dir, backup)  # as if the process died before deleting shipped segments
    await led.close()
    for _ in range(2):  # replay the same log twice
        shutil.rmtree(wal_dir)
        shutil.copytree(backup, wal_dir)
        led = await Ledger.open(database_url, wal_dir, pricing)
        counts = await led.store.count([r.request_id for r in recs])
        assert set(counts.values()) == {1}
        assert (await led.usage(UsageQuery(group_by="none", **ALL_TIME))).totals.requests == 300
        await led.close()
    assert list_segments(wal_dir) == []  # a clean close leaves nothing to replay


async def test_torn_tail_is_ignored_and_earlier_records_kept(database_url, wal_dir, pricing):
    wal_dir.mkdir()
    led = await Ledger.open(database_url, wal_dir, pricing)
    await led._shipper.stop()  # keep the records in the log only, like a crash before shipping
    recs = [usage() for _ in range(20)]
    for r in recs:
        await led.record(r)
    seq = led._writer.seq
    await led._writer.close()
    await led.store.close()
    with open(segment_path(wal_dir, seq), "ab") as f:
        f.write(b"\x50\x00\x00\x00\x01\x02")  # half a frame header and body, as a crash mid-write leaves
    led = await Ledger.open(database_url, wal_dir, pricing)
    assert set(await stored(led)) == {r.request_id for r in recs}
    await led.record(usage(request_id="next"))
    await led.close()
    led = await Ledger.open(database_url, wal_dir, pricing)
    assert len(await stored(led)) == 21
    await led.close()


async def test_segments_rotate_and_are_deleted_once_shipped(database_url, wal_dir, pricing):
    led = await Ledger.open(database_url, wal_dir, pricing, max_segment_bytes=4096)
    recs = [usage() for _ in range(400)]
    for i in range(0, 400, 40):
        await asyncio.gather(*(led.record(r) for r in recs[i:i + 40]))
    await led.flush(10)
    assert led._writer.seq > 5  # rotated many times
    assert list_segments(wal_dir) == [led._writer.seq]  # shipped segments are gone
    assert len(await stored(led)) == 400
    await led.close()


async def test_a_drain_ships_what_was_durable_when_it_began(database_url, wal_dir, pricing):
    """Records made durable while a drain runs wait for the next one: chasing the writer under load shipped a
    few records per transaction, back to back, each an fsync on the disk the answers' own commits wait for."""
    led = await Ledger.open(database_url, wal_dir, pricing)
    await led._shipper.stop()  # drains by hand only
    led._shipper.batch_size = 10  # a drain of ten transactions: time for the later records to become durable
    before = [usage() for _ in range(100)]
    await asyncio.gather(*(led.record(r) for r in before))
    drain = asyncio.create_task(led._shipper.drain())
    await asyncio.sleep(0)  # the drain has taken its mark
    later = [usage() for _ in range(50)]
    await asyncio.gather(*(led.record(r) for r in later))
    await drain
    assert led._shipper.shipped == 100
    assert set(await stored(led)) == {r.request_id for r in before}
    assert not led.caught_up
    await led._shipper.drain()
    assert set(await stored(led)) == {r.request_id for r in before + later}
    assert led.caught_up
    await led.close()


async def test_a_stop_as_a_commit_lands_still_ends_the_shipper(ledger):
    """The shipper waits for the log's next commit; a stop that comes with one (a close right after the last
    requests) must end it. With `asyncio.wait_for` (Python 3.11) the commit's wake-up won, the cancel was lost,
    the shipper ran on and the close waited for it forever."""
    await asyncio.sleep(0.1)  # the shipper waits for a commit
    ledger._writer.durable.set()  # a commit lands...
    await asyncio.wait_for(ledger._shipper.stop(), 30)  # ...as the close stops it (a lost cancel: TimeoutError)
