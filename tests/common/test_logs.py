"""The log lines' timestamp: ISO 8601 in UTC with microseconds, formatted once per second."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from common.logs import UtcStamp


def _parsed(stamp: str) -> datetime:
    assert stamp.endswith("Z") and len(stamp) == len("2026-11-24T13:05:09.041805Z"), stamp
    return datetime.fromisoformat(stamp[:-1]).replace(tzinfo=UTC)


def test_the_stamp_is_the_time_of_the_line_in_utc_with_microseconds():
    stamp = UtcStamp()
    for _ in range(3):  # the first formats its second, the next reuse it (or format the next second)
        before = time.time()
        line = stamp(None, "info", {"event": "x"})
        after = time.time()
        assert before - 1e-6 <= _parsed(line["timestamp"]).timestamp() <= after + 1e-6
        assert line["event"] == "x"


def test_a_new_second_gets_its_own_prefix():
    stamp = UtcStamp()
    first = stamp(None, "info", {})["timestamp"]
    second_started = int(time.time()) + 1
    time.sleep(max(0.0, second_started - time.time()) + 0.01)
    later = stamp(None, "info", {})["timestamp"]
    assert _parsed(later) > _parsed(first)
    assert _parsed(later).replace(microsecond=0) == datetime.fromtimestamp(second_started, UTC)
