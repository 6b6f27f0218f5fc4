"""The overview's budget panel: every budget of the team on screen (and of the signed-in key), in money and in
tokens, as one row each: spent, limit, the share used, the alert thresholds reached, what happens once spent and
when the period resets.

The figures are the Limits page's and `GET /v1/team/limits`'s (`limits.team_limits`, built by
gateway/serving/spending.py's `limits_view`): this module only lays them out. A budget in money is per UTC month
or day, hard (requests refused once spent) or alerts only; a monthly token budget is the limiter's (always hard,
no alerts), its use the tokens the ledger holds this UTC month."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal

import msgspec

from gateway.serving.spending import LimitsView

ISO = "%Y-%m-%dT%H:%M:%SZ"


class BudgetRow(msgspec.Struct):
    scope: str  # "team:<id>" or "key:<id>"
    name: str  # "Team Acme", "Your key ci"
    kind: Literal["money", "tokens"]
    period: str  # "month" or "day" (UTC)
    period_key: str  # "2026-11", "2026-11-27"
    spent: int  # micro-units of money, or tokens
    limit: int
    hard: bool
    thresholds_reached: list[int]  # percent; token budgets send no alerts
    resets_at: str  # ISO 8601 UTC
    projected: float | None = None  # the team's token budget: its share used at the month's end at the recent rate

    @property
    def used(self) -> float:
        """The share of the limit spent (1.0 for a limit of 0: nothing may be spent)."""
        return self.spent / self.limit if self.limit else 1.0

    @property
    def resets_unix(self) -> float:
        return datetime.strptime(self.resets_at, ISO).replace(tzinfo=UTC).timestamp()


def budget_rows(limits: LimitsView, names: dict[str, str], month_key: str,
                projected_tokens: int | None = None) -> list[BudgetRow]:
    """The panel's rows: budgets in money first, then token budgets; the team's before the key's.
    `projected_tokens`: the team's budget tokens at the end of `month_key` (billing/insights/month.py)."""
    rows = [BudgetRow(b.scope, names.get(b.scope, b.scope), "money", b.period, b.period_key, b.spent_micros,
                      b.amount_micros, b.hard, b.thresholds_reached, b.resets_at) for b in limits.budgets]
    for r in limits.rate_limits:
        if r.monthly_token_budget is None or r.token_budget_resets_at is None:
            continue
        team = r.scope == f"team:{limits.team_id}"
        projected = (projected_tokens / r.monthly_token_budget
                     if team and projected_tokens is not None and r.monthly_token_budget else None)
        rows.append(BudgetRow(r.scope, names.get(r.scope, r.scope), "tokens", "month", month_key,
                              r.monthly_tokens_used or 0, r.monthly_token_budget, True, [],
                              r.token_budget_resets_at, projected))
    return rows
