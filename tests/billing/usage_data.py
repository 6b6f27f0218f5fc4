"""A varied, seeded set of usage records for the query tests, and plain-Python sums over them (the
oracle the stores' answers are checked against)."""

from __future__ import annotations

import asyncio
import math
import random
from collections import defaultdict
from datetime import datetime
from zoneinfo import ZoneInfo

from billing.filters import NO_USER, Selection
from billing.records import BUDGET_REFUSED, LedgerEntry
from billing.usage import UsageQuery
from tests.billing.factory import usage
from tests.billing.http import ts

BASE = ts("2025-03-01T00:00:00")
SPAN_DAYS = 40
KEYS = {"team-a": [("key-a", "usr_1"), ("key-a2", "usr_2"), ("key-svc", None), ("key-deleted", "usr_gone")],
        "team-b": [("key-b", "usr_3")]}


def make_records(n: int = 400, seed: int = 14) -> list:
    rnd = random.Random(seed)
    records = []
    for i in range(n):
        team = "team-a" if rnd.random() < 0.8 else "team-b"
        key_id, user_id = rnd.choice(KEYS[team])
        status = rnd.choices(["ok", "cancelled", "error", "rejected"], [70, 8, 7, 15])[0]
        rejected = status == "rejected"
        error_status = rnd.choice([429, 429, 422]) if rejected else 502 if status == "error" else None
        error_code = {429: "rate_limit_exceeded", 422: "invalid_value", 502: "worker_failed"}.get(error_status)
        if rejected and i % 4 == 0:  # a budget's refusal: 429 in OpenAI's dialects, 402 in others
            error_code, error_status = BUDGET_REFUSED, 429 if error_status == 429 else 402
        completion = 0 if rejected else rnd.randint(1, 300)
        records.append(usage(
            request_id=f"req-{i:04d}", time=BASE + rnd.random() * SPAN_DAYS * 86400, team_id=team, key_id=key_id,
            user_id=user_id, model=rnd.choice(["small", "big", "mystery"]), dialect=rnd.choice(["openai", "tgi"]),
            status=status, prompt_tokens=0 if rejected else rnd.randint(0, 5000), completion_tokens=completion,
            compute_tokens=completion * rnd.choice([1, 1, 3]), latency_ms=rnd.uniform(1, 900),
            ttft_ms=None if rejected or rnd.random() < 0.1 else rnd.uniform(1, 200),
            cold_start_ms=rnd.uniform(100, 9000) if rnd.random() < 0.1 else None,
            error_code=error_code, error_status=error_status, adapter=rnd.choice(["", "", "sql-lora"])))
    # a request arriving on a day's first instant, and one a hair before: the edges of a rollup day
    records.append(usage(request_id="req-midnight", time=ts("2025-03-10T00:00:00"), team_id="team-a",
                         key_id="key-a", user_id="usr_1"))
    records.append(usage(request_id="req-before-midnight", time=ts("2025-03-10T00:00:00") - 1e-3, team_id="team-a",
                         key_id="key-a", user_id="usr_1"))
    return records


async def record_all(ledger, records) -> list[LedgerEntry]:
    for i in range(0, len(records), 50):
        await asyncio.gather(*(ledger.record(r) for r in records[i:i + 50]))
    await ledger.flush(30)
    return await ledger.records(UsageQuery(start=0.0, end=4e9))


def selected(entries: list[LedgerEntry], selection: Selection) -> list[LedgerEntry]:
    f = selection.filters
    out = []
    for e in entries:
        u = e.usage
        if not selection.start <= u.time < selection.end or selection.team_id not in (None, u.team_id):
            continue
        user = NO_USER if u.user_id is None else u.user_id
        if any(values and value not in values for values, value in (
                (f.models, u.model), (f.key_ids, u.key_id), (f.user_ids, user), (f.dialects, u.dialect),
                (f.statuses, u.status), (f.adapters, u.adapter))):
            continue
        out.append(e)
    return out


def sums(entries: list[LedgerEntry], key=lambda e: "") -> dict[str, tuple]:
    """key -> (requests, prompt, completion, compute, cost)."""
    out = defaultdict(lambda: [0, 0, 0, 0, 0])
    for e in entries:
        s = out[key(e)]
        for i, v in enumerate((1, e.usage.prompt_tokens, e.usage.completion_tokens, e.usage.compute_tokens,
                               e.cost_micros)):
            s[i] += v
    return {k: tuple(v) for k, v in out.items()}


def local_day(e: LedgerEntry, tz: str) -> str:
    return datetime.fromtimestamp(e.usage.time, ZoneInfo(tz)).date().isoformat()


def local_hour(e: LedgerEntry, tz: str) -> str:
    moment = datetime.fromtimestamp(e.usage.time, ZoneInfo(tz)).replace(minute=0, second=0, microsecond=0)
    return moment.isoformat()


def nearest_rank(values: list[float], fraction: float) -> float | None:
    ordered = sorted(values)
    return ordered[max(math.ceil(fraction * len(ordered)), 1) - 1] if ordered else None
