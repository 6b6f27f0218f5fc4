"""The usage ledger's log never loses a durable record (issue #31, item 2).

A record of any size a request can carry is written as a frame the reader takes back (its strings are cut to
the bounds of billing/bounds.py), across segment rollovers; a frame the reader cannot read in the middle of a
segment stops the shipper loudly (503 `ledger_unavailable`, an error line, the `sluice_ledger_shipping_blocked`
gauge) and nothing after it is skipped or deleted. On main, an oversized frame read as a torn tail, and the
segment holding it, with every later record of every team, was deleted at the next rollover. The same through
the real server: a 404 for a 1.1 MB model name, then ordinary requests, and every record reaches the usage API.
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
import zlib
from pathlib import Path

import httpx
import msgspec
import pytest

from billing import bounds
from billing.ledger import Ledger
from billing.pricing import PricingTable
from billing.records import LedgerEntry
from billing.usage import UsageQuery
from billing.wal import MAX_FRAME, frame, list_segments, segment_path
from common.errors import LedgerUnavailable
from gateway.config import Settings
from gateway.metrics import REGISTRY
from testkit.admin import wait_for_records
from testkit.protocol_worker import worker_process
from testkit.stub_gateway import ADMIN_KEY, sluice_on_worker_process
from tests.billing.factory import usage
from tests.faults.load import MODEL

BODY_LIMIT = Settings().max_body_bytes
ALL_TIME = UsageQuery(start=0.0, end=4e9)
SEGMENT = 64 * 1024  # small segments: many rollovers in one test
FIELDS = ("model", "adapter", "worker_id", "error_code", "key_id", "user_id", "route", "dialect")


def sizes_up_to(limit: int) -> list[int]:
    """Every size around the bounds, then each power of two and its neighbours, up to `limit` itself."""
    sizes = set(range(0, 2 * bounds.MAX_NAME_CHARS + 2))
    power = 1
    while power <= limit:
        sizes.update((power - 1, power, power + 1))
        power *= 2
    sizes.update((MAX_FRAME - 1, MAX_FRAME, MAX_FRAME + 1, limit - 1, limit))
    return sorted(s for s in sizes if 0 <= s <= limit)


async def open_ledger(tmp_path: Path) -> Ledger:
    return await Ledger.open(f"sqlite:///{tmp_path / 'usage.db'}", tmp_path / "wal", PricingTable.static({}),
                             max_segment_bytes=SEGMENT)


async def stored(ledger: Ledger) -> dict:
    return {e.usage.request_id: e.usage for e in await ledger.records(ALL_TIME)}


def blocked_gauge() -> float:
    """The gauge as the gateway's /metrics renders it."""
    return REGISTRY.get_sample_value("sluice_ledger_shipping_blocked")


async def test_records_of_every_size_up_to_the_body_limit_all_reach_the_store(tmp_path):
    ledger = await open_ledger(tmp_path)
    try:
        first_segment = ledger._writer.seq
        expected = {}
        for size in sizes_up_to(BODY_LIMIT):
            long = "m" * size
            # the model name, as a 404 for an unknown model records it, and every other string field in turn,
            # each with a neighbour's ordinary record beside it
            batch = [(field, usage(**{field: long})) for field in FIELDS] + [(None, usage())]
            await asyncio.gather(*(ledger.record(rec) for _, rec in batch))
            expected.update({rec.request_id: (field, size) for field, rec in batch})
        await ledger.flush(60)
        assert ledger._writer.seq - first_segment > 10  # rolled over many times
        records = await stored(ledger)
        assert set(records) == set(expected)  # nothing lost
        for request_id, (field, size) in expected.items():
            rec = records[request_id]
            for name, limit in bounds.FIELD_BOUNDS.items():
                value = getattr(rec, name)
                assert value is None or len(value) <= limit, (name, len(value))
            if field is not None:
                value = getattr(rec, field)
                limit = bounds.FIELD_BOUNDS[field]
                assert value == ("m" * size if size <= limit else "m" * (limit - 1) + bounds.TRIMMED)
        assert list_segments(tmp_path / "wal") == [ledger._writer.seq]  # shipped segments only were deleted
    finally:
        await ledger.close()


def test_the_writer_never_writes_a_frame_the_reader_refuses():
    assert len(frame(b"x" * MAX_FRAME)) == MAX_FRAME + 8
    with pytest.raises(ValueError, match="frame limit"):
        frame(b"x" * (MAX_FRAME + 1))
    # the largest record the bounds allow fits a frame many times over
    assert bounds.MAX_STRING_BYTES + 1024 < MAX_FRAME


async def write_unshipped(tmp_path: Path, count: int) -> tuple[list, int]:
    """`count` records left in the log only (as if the process died before shipping); the segment they are in."""
    ledger = await open_ledger(tmp_path)
    await ledger._shipper.stop()
    recs = [usage() for _ in range(count)]
    for rec in recs:
        await ledger.record(rec)
    seq = ledger._writer.seq
    await ledger._writer.close()
    await ledger.store.close()
    return recs, seq


def frame_offsets(path: Path) -> list[int]:
    data, offsets, pos = path.read_bytes(), [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += 8 + struct.unpack_from("<I", data, pos)[0]
    return offsets


@pytest.mark.parametrize("damage", ["checksum", "oversized_frame", "size_past_the_end"])
async def test_an_unreadable_frame_mid_segment_stops_shipping_loudly_and_loses_nothing(tmp_path, damage):
    recs, seq = await write_unshipped(tmp_path, 40)
    path = segment_path(tmp_path / "wal", seq)
    offsets = frame_offsets(path)
    bad = offsets[10]  # the 11th record of 40: 10 before it, 29 after it
    data = bytearray(path.read_bytes())
    if damage == "checksum":
        data[bad + 9] ^= 0xFF  # one byte of the payload flipped
    elif damage == "size_past_the_end":
        # a length that runs past the end of the file, as a torn tail's does, yet whole frames follow it
        struct.pack_into("<I", data, bad, len(data) - bad)
    else:
        # what main wrote for a 1.1 MB model name: a whole, CRC-valid frame larger than the reader's limit
        payload = b"\x00" * (MAX_FRAME + 100)
        data[bad:bad] = struct.pack("<II", len(payload), zlib.crc32(payload)) + payload
    path.write_bytes(bytes(data))
    damaged = bytes(data)

    ledger = await open_ledger(tmp_path)  # replays at open: stops at the bad frame, starts anyway
    try:
        assert ledger._shipper.blocked is not None
        assert ledger._shipper.blocked.offset == bad
        assert blocked_gauge() == 1
        with pytest.raises(LedgerUnavailable):  # new requests get 503 ledger_unavailable
            ledger.check_writable()
        shipped = await stored(ledger)
        before = {r.request_id for r in recs[:10]}
        assert set(shipped) == before  # what came before the bad frame is in the store, nothing else
        # requests admitted before keep recording; the log rolls over; the damaged segment is never deleted
        later = [usage() for _ in range(1500)]
        for start in range(0, len(later), 100):
            await asyncio.gather(*(ledger.record(rec) for rec in later[start:start + 100]))
        assert ledger._writer.seq > seq + 2
        await asyncio.sleep(2 * ledger._shipper.linger + 0.5)  # the shipper's loop has looked again
        with pytest.raises(Exception, match="at byte"):
            await ledger.flush(5)
        assert path.read_bytes() == damaged
        assert all(segment_path(tmp_path / "wal", s).exists() for s in range(seq + 1, ledger._writer.seq + 1))
        assert set(await stored(ledger)) == before

        # the operator moves the segment aside (docs): shipping resumes by itself, the records after the bad
        # frame are still in the moved file, and every later record reaches the store
        aside = tmp_path / "aside.log"
        os.rename(path, aside)
        await asyncio.wait_for(_until(lambda: ledger._shipper.blocked is None), 30)
        await ledger.flush(30)
        assert blocked_gauge() == 0
        ledger.check_writable()
        assert set(await stored(ledger)) == before | {r.request_id for r in later}
        assert aside.read_bytes() == damaged
    finally:
        await ledger.close()


async def _until(condition) -> None:
    while not condition():
        await asyncio.sleep(0.1)


async def test_a_torn_or_zero_filled_tail_is_no_corruption(tmp_path):
    """What a crash leaves at the end of a segment (part of a frame, or zeros where the file grew before its data
    reached the disk) was never acknowledged: every record before it ships and the segment goes."""
    recs, seq = await write_unshipped(tmp_path, 30)
    path = segment_path(tmp_path / "wal", seq)
    whole = path.read_bytes()
    last = frame_offsets(path)[-1]
    for tail in (b"\x00" * 4096, whole[last:-3], whole[last:last + 5]):
        path.write_bytes(whole + tail)
        ledger = await open_ledger(tmp_path)
        try:
            assert ledger._shipper.blocked is None
            assert set(await stored(ledger)) == {r.request_id for r in recs}
            assert not path.exists()
        finally:
            await ledger.close()


def generate(server, key: str, model: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", timeout=60, headers={"authorization": f"Bearer {key}"},
                      json={"model": model, "prompt": "hi", "max_tokens": 4})


@pytest.mark.slow
def test_a_huge_model_name_404_then_ordinary_requests_every_record_reaches_the_usage_api(tmp_path):
    huge = "x" * 1_100_000  # over the log's 1 MiB frame limit once recorded at full length (main)
    with worker_process() as stub, sluice_on_worker_process(tmp_path / "gw", stub) as server:
        statuses = [generate(server, ADMIN_KEY, huge).status_code]
        statuses += [generate(server, ADMIN_KEY, MODEL).status_code for _ in range(10)]
        # enough large records to roll the log's 8 MiB segment over on main, each followed by a neighbour's request
        for _ in range(8):
            statuses.append(generate(server, ADMIN_KEY, huge).status_code)
            statuses.append(generate(server, ADMIN_KEY, MODEL).status_code)
        assert statuses == [404] + [200] * 10 + [404, 200] * 8
        records = wait_for_records(server, len(statuses), timeout=60)
        assert len(records) == len(statuses)
        assert sorted(r["error_status"] or 200 for r in records) == sorted(statuses)
        assert all(len(r["model"]) <= bounds.MAX_NAME_CHARS for r in records)
        assert sum(r["model"] == MODEL for r in records) == statuses.count(200)


@pytest.mark.slow
def test_a_gateway_whose_log_is_corrupt_mid_segment_answers_503_until_it_is_moved_aside(tmp_path):
    """A log left by an earlier process with a bad frame in the middle: the gateway starts, says so (log line,
    gauge), refuses new requests with 503 `ledger_unavailable`, and deletes nothing; moved aside, it serves."""
    wal = tmp_path / "gw" / "billing-wal"
    wal.mkdir(parents=True)
    encode = msgspec.msgpack.Encoder().encode
    recs = [usage(request_id=f"left-{i}") for i in range(20)]
    frames = [frame(encode(LedgerEntry(rec, 0, 0, 0, time.time()))) for rec in recs]
    frames[5] = frames[5][:-1] + bytes([frames[5][-1] ^ 0xFF])  # a bad checksum, with 14 whole frames after it
    segment = segment_path(wal, 1)
    segment.write_bytes(b"".join(frames))
    damaged = segment.read_bytes()
    with worker_process() as stub, sluice_on_worker_process(tmp_path / "gw", stub) as server:
        refused = generate(server, ADMIN_KEY, MODEL)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "ledger_unavailable"
        assert refused.headers["retry-after"]
        assert server.log_events_once("billing.shipper.corrupt_log", bool)[0]["segment"] == segment.name
        metrics = httpx.get(f"{server.url}/metrics", timeout=30, headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert "sluice_ledger_shipping_blocked 1.0" in metrics.text
        assert segment.read_bytes() == damaged  # nothing skipped, nothing deleted

        os.rename(segment, tmp_path / "aside.log")
        deadline = time.monotonic() + 120
        while (served := generate(server, ADMIN_KEY, MODEL)).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert served.status_code == 200
        records = wait_for_records(server, 6)
        assert {r["request_id"] for r in records} >= {f"left-{i}" for i in range(5)}
