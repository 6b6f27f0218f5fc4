"""The ledger's disk fills up (its write-ahead log on a 4 MiB tmpfs): new requests get 503 `ledger_unavailable`
with Retry-After and never reach a worker; a request admitted before whose record cannot be written is withheld
(503), never served unbilled; once space returns, service resumes by itself, and every request served is in the
ledger exactly once. Mounting the tmpfs needs root (CI runs as root); elsewhere the test is skipped."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from testkit.admin import wait_for_records
from testkit.protocol_worker import worker_process
from testkit.stub_gateway import sluice_on_worker_process
from tests.disks import small_disk
from tests.faults.load import MODEL

pytestmark = pytest.mark.slow
RESERVE = 1 << 20


def fill(path: Path, leave: int) -> Path:
    """A file that takes the disk's free space down to about `leave` bytes (0: until it is full)."""
    filler = path / f"filler-{time.monotonic_ns()}"
    with open(filler, "wb") as f, contextlib.suppress(OSError):  # ENOSPC when filling to the brim
        while True:
            stat = os.statvfs(path)
            free = stat.f_bavail * stat.f_frsize
            if free <= leave:
                break
            f.write(b"\0" * min(free - leave, 1 << 16) if leave else b"\0" * 4096)
            f.flush()
    return filler


def completion(server, stream: bool = False, max_tokens: int = 8) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", timeout=60, headers={"authorization": f"Bearer {server.api_key}"},
                      json={"model": MODEL, "prompt": "hi", "max_tokens": max_tokens, "stream": stream})


def test_a_full_ledger_disk_refuses_new_requests_until_space_returns(tmp_path):
    data = tmp_path / "gw"
    with small_disk(data / "billing-wal") as wal, worker_process(token_delay=0.01) as stub, \
            sluice_on_worker_process(data, stub, f"ledger_min_free_bytes = {RESERVE}") as server:
        served = [completion(server), completion(server, stream=True)]
        assert [r.status_code for r in served] == [200, 200]
        started = stub.stats()["started"]

        # below the reserve: refused before any worker sees them
        low = fill(wal, leave=RESERVE // 2)
        time.sleep(0.3)
        refused = [completion(server), completion(server, stream=True)]
        assert [r.status_code for r in refused] == [503, 503]
        assert all(r.json()["error"]["code"] == "ledger_unavailable" and r.headers["retry-after"] for r in refused)
        assert stub.stats()["started"] == started

        # space returns: served again, by itself
        low.unlink()
        freed = time.monotonic()
        while (response := completion(server)).status_code == 503 and time.monotonic() - freed < 10:
            time.sleep(0.05)
        recovery = time.monotonic() - freed
        assert response.status_code == 200
        served.append(response)

        # requests admitted in time whose records find the disk full at their end (more records than the log's
        # last page still holds): each one is either served and recorded, or withheld with 503, never served
        # unbilled
        # the disk taken down near the reserve first, so that filling it to the brim once they run takes a moment
        # even on a loaded host (answers of 150 tokens last ~1.5 s; a 4 MiB fill at 4 KiB a write did not always)
        near = fill(wal, leave=2 * RESERVE)
        in_flight: list[httpx.Response] = []
        runners = [threading.Thread(target=lambda: in_flight.append(completion(server, max_tokens=300)))
                   for _ in range(24)]
        for runner in runners:
            runner.start()
        deadline = time.monotonic() + 30
        while stub.stats()["running"] < len(runners) and time.monotonic() < deadline:  # all admitted, generating
            time.sleep(0.05)
        brim = fill(wal, leave=0)
        for runner in runners:
            runner.join()
        withheld = [r for r in in_flight if r.status_code != 200]
        assert withheld and all(r.status_code == 503 and r.json()["error"]["code"] == "ledger_unavailable"
                                for r in withheld)
        served.extend(r for r in in_flight if r.status_code == 200)
        brim.unlink()
        near.unlink()
        time.sleep(0.3)
        served.append(completion(server))
        assert served[-1].status_code == 200
        records = wait_for_records(server, len(served))
        failures = server.log_events("ledger_record_failed")
    print(f"\nledger disk full: refused with 503 below the {RESERVE >> 10} KiB reserve; served again {recovery:.2f} s "
          f"after space returned; {len(withheld)} of 24 in-flight answers withheld at a full disk")
    ids = Counter(r["request_id"] for r in records)
    assert set(ids) == {r.headers["x-request-id"] for r in served} and set(ids.values()) == {1}
    assert len(failures) == len(withheld)
