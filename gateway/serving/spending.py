"""Budgets as their team's members see them (`limits_view`: `GET /v1/team/limits`, the dashboard's Limits page and
its overview's budget panel): each budget's spend so far in its period as the ledger holds it (`SpendReader`).
The budgets themselves, their reservations, refusals and alerts, are gateway/serving/budget_gate.py's.

- **Spend** is the ledger's cost (or budget tokens) of the scope's requests since the period began (UTC month or
  day; billing/budgets.py). A store that cannot be read shows none rather than failing the page.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import msgspec
import structlog

from auth import Principal
from auth.models import Limits, SpendBudget
from billing.budgets import Window, period_window, reached, spent_micros, spent_tokens
from billing.store.base import UsageStore

log = structlog.get_logger("gateway.spending")


def iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Spend(msgspec.Struct, frozen=True):
    """One budget's standing, as the dashboard and the refusal show it."""

    scope: str
    budget: SpendBudget
    window: Window
    spent_micros: int

    @property
    def thresholds(self) -> list[int]:
        return reached(self.spent_micros, self.budget.amount_micros)

    @property
    def exhausted(self) -> bool:
        return self.spent_micros >= self.budget.amount_micros


def scoped_limits(principal: Principal) -> list[tuple[str, Limits | None]]:
    """The limits a request of `principal` answers to: its billed team's and its key's."""
    return [(f"team:{principal.team_id}", principal.team_limits), (f"key:{principal.key_id}", principal.key_limits)]


def budgets_of(scoped: list[tuple[str, Limits | None]]) -> list[tuple[str, SpendBudget]]:
    return [(scope, limits.spend_budget) for scope, limits in scoped
            if limits is not None and limits.spend_budget is not None]


class SpendReader:
    """The ledger's figures of a scope's budgets, for the views (not for admission: budget_gate.py)."""

    def __init__(self, store: UsageStore) -> None:
        self._store = store

    async def standing(self, scoped: list[tuple[str, Limits | None]]) -> list[Spend]:
        return [await self.spend(scope, budget) for scope, budget in budgets_of(scoped)]

    async def spend(self, scope: str, budget: SpendBudget) -> Spend:
        now = time.time()
        window = period_window(budget.period, now)
        try:
            micros = await spent_micros(self._store, scope, window, now)
        except Exception as exc:  # noqa: BLE001 - an unreadable store must not fail the page
            log.warning("spend_unreadable", scope=scope, error=f"{type(exc).__name__}: {exc}")
            micros = 0
        return Spend(scope, budget, window, micros)

    async def tokens(self, scope: str, window: Window, now: float) -> int:
        """The tokens of `scope`'s requests in `window` so far, as a monthly token budget counts them."""
        return await spent_tokens(self._store, scope, window, now)


class BudgetView(msgspec.Struct):
    """A budget in money as its team's members see it (`GET /v1/team/limits`, the dashboard's Limits page)."""

    scope: str
    period: str
    period_key: str
    amount_micros: int
    spent_micros: int
    hard: bool
    thresholds_reached: list[int]
    resets_at: str  # ISO 8601 UTC
    alerts_to_webhook: bool
    alerts_to_emails: int


class RateView(msgspec.Struct):
    """A scope's rate limits: rpm and tpm are sliding 60 s windows (capacity returns 60 s after each request),
    the monthly token budget resets at `token_budget_resets_at`; `monthly_tokens_used` is what the ledger
    holds of it this UTC month (prompt + compute tokens; the budget also holds back what requests still running
    reserved)."""

    scope: str
    rpm: int | None
    tpm: int | None
    max_concurrency: int | None
    monthly_token_budget: int | None
    window_s: int = 60
    token_budget_resets_at: str | None = None
    monthly_tokens_used: int | None = None  # None: no token budget (or no ledger to read)


class LimitsView(msgspec.Struct):
    team_id: str
    rate_limits: list[RateView]
    budgets: list[BudgetView]


async def limits_view(gate: SpendReader | None, team_id: str, scoped: list[tuple[str, Limits | None]], *,
                      team_month_tokens: int | None = None) -> LimitsView:
    """A team's (and a key's) limits and budgets, with spend so far and reset times. `team_month_tokens`: the
    team's budget tokens this UTC month when the caller has counted them already (the dashboard's overview)."""
    now = time.time()
    month = period_window("month", now)
    rates = []
    for scope, limits in scoped:
        if limits is not None:
            budgeted = limits.monthly_token_budget is not None
            used = None
            if budgeted and scope == f"team:{team_id}" and team_month_tokens is not None:
                used = team_month_tokens
            elif budgeted and gate is not None:
                used = await gate.tokens(scope, month, now)
            rates.append(RateView(scope, limits.rpm, limits.tpm, limits.max_concurrency, limits.monthly_token_budget,
                                  token_budget_resets_at=iso(month.end) if budgeted else None,
                                  monthly_tokens_used=used))
    budgets = []
    for spend in (await gate.standing(scoped) if gate is not None else []):
        b = spend.budget
        budgets.append(BudgetView(spend.scope, b.period, spend.window.key, b.amount_micros, spend.spent_micros,
                                  b.hard, spend.thresholds, iso(spend.window.end), b.webhook_url is not None,
                                  len(b.emails)))
    return LimitsView(team_id, rates, budgets)
