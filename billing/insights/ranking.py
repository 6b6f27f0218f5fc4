"""The admin's ranking of teams over a window: each team's sums, biggest spender first."""

from __future__ import annotations

import msgspec

from billing.filters import Selection
from billing.insights.sources import Source, fetch_parts, for_totals
from billing.insights.sums import Sums, ranked
from billing.store.base import UsageStore
from storage.sql_dialect import Params


async def team_ranking(store: UsageStore, selection: Selection, limit: int | None = None) -> list[Sums]:
    """Every team with usage in the window (or the first `limit`), `Sums.key` being the team id.
    The selection's own team, if any, is ignored: a ranking spans teams."""
    def statement(source: Source, part: Selection, params: Params) -> str:
        return (f"SELECT team_id, {source.sums()} FROM {source.table} WHERE {source.where(part, params)} "
                "GROUP BY team_id")

    teams: dict[str, Sums] = {}
    for team, *values in await fetch_parts(store, for_totals(msgspec.structs.replace(selection, team_id=None)),
                                           statement):
        teams.setdefault(team, Sums(team)).add(Sums.of(team, values))
    ordered = ranked(teams.values())
    return ordered if limit is None else ordered[:limit]
