"""What a team's owners set on the team itself: its budgets (`PUT /v1/team/budgets`, the dashboard's Limits page)
within the operator's ceiling (auth/budget_rules.py), and its health alerts (`PUT /v1/team/alerts`); each checked
and written in one transaction, audited with what changed."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from auth.admin import Actor, audit_entry
from auth.bounds import RecordBounds, counted_team
from auth.budget_rules import team_budgets_refusal, with_budgets
from auth.errors import RequestError
from auth.models import HealthAlerts, Limits, TeamBudgets, TeamRecord
from auth.policy import Manager, capped, check_manages
from auth.store import Store


class TeamBudgetOps:
    def __init__(self, store: Store, forget: Callable[..., None], bounds: RecordBounds | None = None) -> None:
        self._store = store
        self._forget = forget
        self._bounds = bounds or RecordBounds()  # the team's audit budget (auth/bounds.py)

    async def set(self, actor: Actor, manager: Manager, team_id: str, body: TeamBudgets) -> Limits:
        """The team's limits after the change: 403 for a member, 403 naming the field above the ceiling (or when
        the operator set none); the operator (an admin key) is not capped."""
        check_manages(manager)

        def changed(team: TeamRecord) -> Limits:
            if capped(manager.is_admin):
                refused = team_budgets_refusal(team.limits.ceiling if team.limits is not None else None, body)
                if refused is not None:
                    raise RequestError(403, "above_ceiling" if refused[0] != "ceiling" else "no_ceiling",
                                       refused[1], refused[0])
            return with_budgets(team.limits, body)

        return await self._change(actor, manager, team_id, "teams.budgets", changed,
                                  lambda limits: {"limits": msgspec.to_builtins(limits)})

    async def set_alerts(self, actor: Actor, manager: Manager, team_id: str, alerts: HealthAlerts | None) -> Limits:
        """The team's health alerts (None: none), set by its owners (no ceiling caps them); the team's limits after."""
        check_manages(manager)
        return await self._change(actor, manager, team_id, "teams.alerts",
                                  lambda team: msgspec.structs.replace(team.limits or Limits(), health_alerts=alerts),
                                  lambda _: {"health_alerts": msgspec.to_builtins(alerts)})

    async def _change(self, actor: Actor, manager: Manager, team_id: str, action: str,
                      changed: Callable[[TeamRecord], Limits],
                      detail: Callable[[Limits], dict[str, object]]) -> Limits:
        """`changed(team)` written and audited as `action` in one transaction, unless it changes nothing; 404 for
        a team that is not there."""
        async with self._store.transaction() as tx:
            team = await tx.get_team(team_id)
            if team is None:
                raise RequestError(404, "team_not_found", f"No team {team_id!r}.", "team_id")
            limits = changed(team)
            if limits != team.limits:
                await tx.update_team(msgspec.structs.replace(team, limits=limits))
                await self._bounds.audit(tx, audit_entry(actor, action, team_id, detail(limits)),
                                         counted_team(manager, team_id))
        self._forget(team=team_id)
        return limits
