"""Budgets in money (`Limits.spend_budget` of a key or a team): the spend so far in the budget's period, the
refusal of a hard budget once spent, and its alerts at 50, 80 and 100 %; and the view of a team's limits and
budgets (`limits_view`: `GET /v1/team/limits`, the dashboard's Limits page and its overview's budget panel).

- **Spend** is the ledger's cost of the scope's requests since the period began (UTC month or day;
  billing/budgets.py), read at most once per `cache_s` per scope and gateway: a request admitted meanwhile, and
  records still on their way from the ledger's log to its database, can carry a scope past its amount by what
  they cost. A store that cannot be read keeps the last figure (or none) rather than refusing everyone.
- **Hard** budgets refuse a new request once spent: 429 `insufficient_quota` (`SpendBudgetExhausted`), restated by
  the dialects whose service answers credit run out otherwise (Anthropic's 402 `billing_error`; 402 on the TGI-shaped
  routes), with no Retry-After and `x-should-retry: false`; a rate limit stays a 429 with Retry-After.
- **Alerts**: a threshold the spend reached is claimed in the ledger's database (insert-once per scope,
  period and threshold, so a fleet of gateways sends it once), then sent beside the request path
  (gateway/serving/budget_alerts.py). A threshold is noticed when a request of the scope is admitted.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import msgspec
import structlog

from auth import Principal
from auth.models import Limits, SpendBudget
from billing.budgets import Window, period_window, reached, spent_micros, spent_tokens
from billing.store.base import UsageStore
from gateway.errors import SpendBudgetExhausted
from gateway.serving.budget_alerts import ADJECTIVE, Alert, AlertSender

log = structlog.get_logger("gateway.spending")
CACHE_S = 1.0


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


class SpendGate:
    def __init__(self, store: UsageStore, sender: AlertSender, *, cache_s: float = CACHE_S) -> None:
        self._store, self._sender, self._cache_s = store, sender, cache_s
        self._spent: dict[tuple[str, str], tuple[float, int]] = {}  # (scope, period key) -> (read at, micros)
        self._noticed: dict[str, tuple[str, set[int]]] = {}  # scope -> (period key, thresholds already handled)
        self._tasks: set[asyncio.Task] = set()

    async def check(self, principal: Principal) -> None:
        """Raise SpendBudgetExhausted when a hard budget of the request is spent; start the alerts of thresholds
        reached."""
        for scope, budget in budgets_of(scoped_limits(principal)):
            spend = await self.spend(scope, budget)
            self._notice(spend)
            if budget.hard and spend.exhausted:
                what = "key" if scope.startswith("key:") else "team"
                raise SpendBudgetExhausted(
                    f"You exceeded your current quota: the {what}'s {ADJECTIVE[budget.period]} budget of "
                    f"{budget.amount_micros / 1e6:.2f} is spent ({spend.spent_micros / 1e6:.2f} in "
                    f"{spend.window.key}). It resets at {iso(spend.window.end)}, or when the operator raises "
                    f"it.")

    async def standing(self, scoped: list[tuple[str, Limits | None]]) -> list[Spend]:
        return [await self.spend(scope, budget) for scope, budget in budgets_of(scoped)]

    async def spend(self, scope: str, budget: SpendBudget) -> Spend:
        now = time.time()
        window = period_window(budget.period, now)
        cached = self._spent.get((scope, window.key))
        if cached is not None and now - cached[0] < self._cache_s:
            return Spend(scope, budget, window, cached[1])
        try:
            micros = await spent_micros(self._store, scope, window, now)
        except Exception as exc:  # noqa: BLE001 - an unreadable store must not refuse every request
            log.warning("spend_unreadable", scope=scope, error=f"{type(exc).__name__}: {exc}")
            return Spend(scope, budget, window, cached[1] if cached is not None else 0)
        if len(self._spent) > 100_000:  # scopes of past periods and idle keys
            self._spent.clear()
        self._spent[(scope, window.key)] = (now, micros)
        return Spend(scope, budget, window, micros)

    async def tokens(self, scope: str, window: Window, now: float) -> int:
        """The tokens of `scope`'s requests in `window` so far, as a monthly token budget counts them."""
        return await spent_tokens(self._store, scope, window, now)

    def _notice(self, spend: Spend) -> None:
        period_key, handled = self._noticed.get(spend.scope, ("", set()))
        if period_key != spend.window.key:
            handled = set()
            self._noticed[spend.scope] = (spend.window.key, handled)
        for threshold in spend.thresholds:
            if threshold not in handled:
                handled.add(threshold)
                task = asyncio.get_running_loop().create_task(self._alert(spend, threshold))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _alert(self, spend: Spend, threshold: int) -> None:
        now = time.time()
        try:
            if not await self._store.claim_alert(spend.scope, spend.window.key, threshold, now):
                return  # another gateway (or an earlier start) sent it
        except Exception as exc:  # noqa: BLE001 - forget it: a later request of the scope tries again
            self._noticed.get(spend.scope, ("", set()))[1].discard(threshold)
            log.warning("budget_alert_unclaimed", scope=spend.scope, error=f"{type(exc).__name__}: {exc}")
            return
        budget = spend.budget
        log.info("budget_alert", scope=spend.scope, period=spend.window.key, threshold=threshold)
        alert = Alert(spend.scope, budget.period, spend.window.key, iso(spend.window.end), threshold,
                      budget.amount_micros, spend.spent_micros, budget.hard, iso(now))
        await self._sender.send(alert, budget.webhook_url, list(budget.emails))

    async def close(self) -> None:
        """Let the alerts under way finish (each is bounded by its timeouts and attempts)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._sender.close()


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
    holds of it this UTC month (prompt + compute tokens; the limiter also counts requests still running)."""

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


async def limits_view(gate: SpendGate | None, team_id: str, scoped: list[tuple[str, Limits | None]], *,
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
