"""What each of a team's batches cost and saved, summed from the ledger's records of its lines (`batch_id`):
cost, what the batch rate and the prefix cache saved against the list prices, cached prompt tokens. Integer
micro-dollars summed in the database, so exact. Read by team and time (the records' index), from the oldest
batch's creation on, so a page of batches costs one range read of the team's records since then."""

from __future__ import annotations

import msgspec

from billing.store.base import TABLE, UsageStore
from storage.sql_dialect import Params

MAX_BATCHES = 1000  # batch ids one read names


class BatchSpend(msgspec.Struct, frozen=True):
    records: int = 0
    cost_micros: int = 0
    batch_saved_micros: int = 0
    cache_saved_micros: int = 0
    cached_tokens: int = 0


async def batch_spend(store: UsageStore, team_id: str, batch_ids: list[str], since: float) -> dict[str, BatchSpend]:
    """The spend of each of `batch_ids` that has records of `team_id` at or after `since` (a batch of another team
    sums nothing); batches without records are left out."""
    if not batch_ids:
        return {}
    if len(batch_ids) > MAX_BATCHES:
        raise ValueError(f"at most {MAX_BATCHES} batches at once")
    params = Params(store.dialect)
    named = ", ".join(params(batch_id) for batch_id in batch_ids)
    rows = await store.fetch(
        f"SELECT batch_id, COUNT(*), SUM(cost_micros), SUM(batch_saved_micros), SUM(cache_saved_micros), "
        f"SUM(cached_tokens) FROM {TABLE} WHERE team_id = {params(team_id)} AND time >= {params(since)} "
        f"AND batch_id IN ({named}) GROUP BY batch_id", params.values)
    return {batch_id: BatchSpend(*(int(value or 0) for value in sums)) for batch_id, *sums in rows}
