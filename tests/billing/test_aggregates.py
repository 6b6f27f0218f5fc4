"""Aggregates always equal the sums of the raw records, for every grouping and window (hypothesis):
whether a window's whole days come from the rollups and its edges from the records, or all of it
from the records, and whatever was replayed."""

from __future__ import annotations

import itertools
import time
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing.ledger import Ledger
from billing.store.base import utc_day
from billing.usage import UsageQuery
from tests.billing.factory import usage

_windows = itertools.count()
SPAN = 40 * 86400  # each example writes inside its own 40-day window, so examples never mix

records_strategy = st.lists(
    st.fixed_dictionaries({
        "offset": st.floats(0, SPAN - 1, allow_nan=False),
        "team_id": st.sampled_from(["t1", "t2", "t3"]),
        "key_id": st.sampled_from(["k1", "k2"]),
        "user_id": st.sampled_from([None, "u1"]),
        "dialect": st.sampled_from(["openai", "tgi"]),
        "replayed": st.booleans(),
        "model": st.sampled_from(["small", "big", "other"]),
        "adapter": st.sampled_from(["", "poet"]),
        "status": st.sampled_from(["ok", "cancelled", "error", "rejected"]),
        "prompt_tokens": st.integers(0, 200_000),
        "completion_tokens": st.integers(0, 50_000),
        "extra_compute": st.integers(0, 50_000),
    }),
    max_size=40,
)

KEY = {"day": lambda e: utc_day(e.usage.time), "model": lambda e: e.usage.model, "key": lambda e: e.usage.key_id,
       "team": lambda e: e.usage.team_id, "none": lambda e: "", "user": lambda e: e.usage.user_id or "-",
       "dialect": lambda e: e.usage.dialect, "status": lambda e: e.usage.status,
       "adapter": lambda e: e.usage.adapter or "-",
       "hour": lambda e: time.strftime("%Y-%m-%dT%H:00:00+00:00", time.gmtime(e.usage.time))}


def expected(entries, group_by):
    sums = defaultdict(lambda: [0, 0, 0, 0, 0])
    for e in entries:
        s = sums[KEY[group_by](e)]
        for i, v in enumerate((1, e.usage.prompt_tokens, e.usage.completion_tokens, e.usage.compute_tokens,
                               e.cost_micros)):
            s[i] += v
    return {k: tuple(v) for k, v in sums.items()}


@settings(max_examples=20, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs=records_strategy, cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
       team=st.sampled_from([None, "t1", "t2"]))
async def test_aggregates_equal_raw_sums(ledger: Ledger, specs, cut, team):
    base = 1.6e9 + next(_windows) * SPAN
    replays = []
    for spec in specs:
        record = usage(time=base + spec["offset"], team_id=spec["team_id"], key_id=spec["key_id"],
                       user_id=spec["user_id"], dialect=spec["dialect"], model=spec["model"], status=spec["status"],
                       adapter=spec["adapter"],
                       prompt_tokens=spec["prompt_tokens"], completion_tokens=spec["completion_tokens"],
                       compute_tokens=spec["completion_tokens"] + spec["extra_compute"])
        await ledger.record(record)
        if spec["replayed"]:
            replays.append(record)
    await ledger.flush(10)
    for record in replays:  # shipped again, as after a crash: stored once, counted once
        await ledger.record(record)
    await ledger.flush(10)
    start, end = base + min(cut) * SPAN, base + max(cut) * SPAN
    raw = await ledger.records(UsageQuery(start=start, end=end, team_id=team))
    assert all(start <= e.usage.time < end and team in (None, e.usage.team_id) for e in raw)
    everything = await ledger.records(UsageQuery(start=base, end=base + SPAN))
    assert len(everything) == len(specs)
    for group_by in KEY:
        report = await ledger.usage(UsageQuery(start=start, end=end, team_id=team, group_by=group_by))
        got = {r.key: (r.requests, r.prompt_tokens, r.completion_tokens, r.compute_tokens, r.cost_micros)
               for r in report.rows}
        assert got == expected(raw, group_by)
        t = report.totals
        assert (t.requests, t.prompt_tokens, t.completion_tokens, t.compute_tokens, t.cost_micros) == (
            len(raw), sum(e.usage.prompt_tokens for e in raw), sum(e.usage.completion_tokens for e in raw),
            sum(e.usage.compute_tokens for e in raw), sum(e.cost_micros for e in raw))
