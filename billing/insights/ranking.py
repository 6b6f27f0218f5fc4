"""The admin's ranking of teams over a window: each team's sums, biggest spender first."""

from __future__ import annotations

import msgspec

from billing.filters import Selection, where
from billing.insights.sums import SUMS_SQL, Sums, ranked
from billing.store.base import TABLE, UsageStore
from billing.store.sql import Params


async def team_ranking(store: UsageStore, selection: Selection, limit: int | None = None) -> list[Sums]:
    """Every team with usage in the window (or the first `limit`), `Sums.key` being the team id.
    The selection's own team, if any, is ignored: a ranking spans teams."""
    every_team = msgspec.structs.replace(selection, team_id=None)
    params = Params(store.dialect)
    rows = await store.fetch(f"SELECT team_id, {SUMS_SQL} FROM {TABLE} WHERE {where(every_team, params)} "
                             "GROUP BY team_id", params.values)
    teams = ranked(Sums.of(team, values) for team, *values in rows)
    return teams if limit is None else teams[:limit]
