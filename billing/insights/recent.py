"""A team's latest requests as the fleet's ledger holds them, for judgements over a sliding window (the health
alerts: gateway/serving/health_alerts.py): every gateway's records, not one gateway's share."""

from __future__ import annotations

from billing.store.base import TABLE, UsageStore
from storage.sql_dialect import Params

JUDGED = ("ok", "error")  # answered, or failed once admitted (refusals and cancellations say nothing of health)


async def recent_requests(store: UsageStore, team_id: str, start: float, end: float,
                          limit: int) -> list[tuple[float, bool, float]]:
    """(time, failed, latency ms) of the team's requests that were answered or failed with start <= time <= end,
    oldest first: the newest `limit` of them."""
    params = Params(store.dialect)
    statuses = store.dialect.one_of("status", JUDGED, params)
    rows = await store.fetch(
        f"SELECT time, status, latency_ms FROM {TABLE} WHERE team_id = {params(team_id)} "
        f"AND time >= {params(float(start))} AND time <= {params(float(end))} AND {statuses} "
        f"ORDER BY time DESC LIMIT {params(int(limit))}", params.values)
    return [(float(t), status == "error", float(latency)) for t, status, latency in reversed(rows)]
