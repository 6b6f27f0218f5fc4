"""A request's budgets, in tokens (`Limits.monthly_token_budget`) and in money (`Limits.spend_budget`), of its key
and its billed team, through the one budget book (gateway/limits/budgets.py):

- **Seeded from the ledger**: a budget's counter starts, the first time a gateway needs it in a period, from the
  ledger's sum of the scope's period so far (prompt + compute tokens, or cost), so a restart resumes where it was.
- **Reserved before admission**: the request's upper bound, its token reservation (gateway/limits/tokens.py) and
  that many tokens at the higher of the model's two prices, on every budget at once or on none; a hard budget
  without room refuses it (`QuotaExceeded`). Concurrent requests cannot pass a hard budget together.
- **Settled when it ends** to what it really used and cost (the ledger's own price rule).
- **Alerts** at 50, 80 and 100 % of a budget in money fire when a settlement carries the settled spend across a
  threshold: the request that crosses it triggers it, once (claimed insert-once in the ledger's database, so
  one gateway of a fleet sends it, once per period), sent beside the request path (budget_alerts.py).
"""

from __future__ import annotations

import time

import structlog

from auth import Principal
from auth.models import SpendBudget
from billing.budgets import THRESHOLDS, Window, period_window, spent_micros, spent_tokens
from billing.pricing import PricingTable
from billing.store.base import UsageStore
from gateway.errors import QuotaExceeded, Unavailable
from gateway.lifecycle import Background
from gateway.limits.budget_model import BudgetLine, BudgetSpent, Hold
from gateway.limits.budgets import open_book
from gateway.limits.model import LimiterUnavailable
from gateway.serving.budget_alerts import ADJECTIVE, Alert, AlertSender
from gateway.serving.spending import iso, scoped_limits

log = structlog.get_logger("gateway.budgets")


class BudgetHold:
    """What a request reserved, and what its settlement needs: the model's price when it arrived."""

    __slots__ = ("hold", "budgets", "model", "arrived")

    def __init__(self, hold: Hold, budgets: list[SpendBudget | None], model: str, arrived: float):
        self.hold, self.budgets, self.model, self.arrived = hold, budgets, model, arrived


def budget_lines(principal: Principal, now: float) -> list[tuple[BudgetLine, SpendBudget | None]]:
    """Every budget a request of `principal` answers to now (a money budget with its alert settings)."""
    lines: list[tuple[BudgetLine, SpendBudget | None]] = []
    for scope, limits in scoped_limits(principal):
        if limits is None:
            continue
        if limits.monthly_token_budget is not None:
            month = period_window("month", now)
            lines.append((BudgetLine(scope, "tokens", "month", month.key, month.start, month.end,
                                     limits.monthly_token_budget), None))
        budget = limits.spend_budget
        if budget is not None:
            window = period_window(budget.period, now)
            lines.append((BudgetLine(scope, "micros", budget.period, window.key, window.start, window.end,
                                     budget.amount_micros if budget.hard else None), budget))
    return lines


class BudgetGate:
    def __init__(self, store: UsageStore | None, pricing: PricingTable | None, sender: AlertSender | None, *,
                 redis_url: str | None = None, fail_open: bool = False, credentials=None) -> None:
        """`store`: the ledger's (None: budgets count from zero at each start); `redis_url`: the counters are the
        fleet's, in Redis (failing open or closed as the limiter does), else this process's."""
        self._store, self._pricing, self._sender = store, pricing, sender
        self.book = open_book(redis_url, self.seed, fail_open=fail_open, credentials=credentials)
        self._tasks = Background("budget alerts")

    async def seed(self, line: BudgetLine) -> int:
        """The ledger's sum of the budget's period so far (0 without a ledger); 503 when it cannot be read: a
        budget that cannot be known cannot be kept."""
        if self._store is None:
            return 0
        measure = spent_tokens if line.measure == "tokens" else spent_micros
        try:
            return await measure(self._store, line.scope, Window(line.period_key, line.start, line.end), time.time())
        except Exception as exc:  # noqa: BLE001 - any store failure: refuse for now, retry on the next request
            log.warning("budget_unreadable", scope=line.scope, error=f"{type(exc).__name__}: {exc}")
            raise Unavailable("budgets cannot be read from the usage ledger; retry shortly",
                              code="budget_unavailable") from exc

    async def reserve(self, principal: Principal, model: str, tokens: int, arrived: float) -> BudgetHold | None:
        """Reserve the request's bound on each of its budgets, or raise the refusal (None: it has no budget)."""
        found = budget_lines(principal, arrived)
        if not found:
            return None
        price = self._pricing.price(model, arrived) if self._pricing is not None else None
        most = max(price.input_micros, price.output_micros) if price is not None else 0
        amounts = [tokens if line.measure == "tokens" else (tokens * most + 500_000) // 1_000_000
                   for line, _ in found]
        try:
            hold = await self.book.reserve([line for line, _ in found], amounts)
        except BudgetSpent as spent:
            raise refusal(spent) from None
        except LimiterUnavailable as exc:  # Redis down and failing closed, as the limiter answers it
            raise Unavailable("budgets are unavailable; retry shortly", code="limiter_unavailable") from exc
        return BudgetHold(hold, [budget for _, budget in found], model, arrived)

    async def settle(self, held: BudgetHold, prompt_tokens: int, output_tokens: int, compute_tokens: int, *,
                     cached_tokens: int = 0, batch: bool = False) -> None:
        """Charge what the request used and cost (nothing for one refused after reserving), then send the alerts
        of the thresholds this settlement carried the spend across. The cost is the ledger's: cached prompt tokens
        at the cached-input price, a batch line at the batch rate."""
        price = self._pricing.price(held.model, held.arrived) if self._pricing is not None else None
        cost = (price.charge(prompt_tokens, output_tokens, cached_tokens=cached_tokens, batch=batch).cost_micros
                if price is not None else 0)
        actual = [prompt_tokens + compute_tokens if line.measure == "tokens" else cost for line in held.hold.lines]
        budgets = {line.id: budget for line, budget in zip(held.hold.lines, held.budgets)}
        for line, before, after in await self.book.settle(held.hold, actual):  # lines it still counts
            budget = budgets[line.id]
            if budget is None or self._sender is None:
                continue
            for threshold in THRESHOLDS:
                mark = budget.amount_micros * threshold
                if before * 100 < mark <= after * 100:
                    self._start(self._alert(line, budget, threshold, after))

    def _start(self, job) -> None:
        self._tasks.spawn(job)

    async def _alert(self, line: BudgetLine, budget: SpendBudget, threshold: int, spent: int) -> None:
        now = time.time()
        try:
            if self._store is None or not await self._store.claim_alert(line.scope, line.period_key, threshold, now):
                return  # another gateway (or an earlier start) sent it
        except Exception as exc:  # noqa: BLE001 - a store that cannot record it: not sent, logged
            log.warning("budget_alert_unclaimed", scope=line.scope, error=f"{type(exc).__name__}: {exc}")
            return
        log.info("budget_alert", scope=line.scope, period=line.period_key, threshold=threshold)
        alert = Alert(line.scope, budget.period, line.period_key, iso(line.end), threshold, budget.amount_micros,
                      spent, budget.hard, iso(now))
        await self._sender.send(alert, budget.webhook_url, list(budget.emails))

    async def close(self) -> None:
        """Let the alerts under way finish (each is bounded by its timeouts and attempts: `longest_s`)."""
        if self._sender is not None:
            await self._tasks.stop(self._sender.longest_s, cancel=False)
            await self._sender.close()
        await self.book.close()


def refusal(spent: BudgetSpent) -> QuotaExceeded:
    """A budget without room for the request, in the same words whether it counts tokens or money; one that the
    request exceeds by itself too (the same status and code in each dialect: a budget refusal is never a rate
    limit; the message says what to lower)."""
    line = spent.line
    what = "key" if line.scope.startswith("key:") else "team"
    if line.measure == "tokens":
        name, show = f"monthly token budget of {line.limit:,} tokens", (lambda n: f"{n:,}")
    else:
        name, show = f"{ADJECTIVE[line.period]} budget of {line.limit / 1e6:.2f}", (lambda n: f"{n / 1e6:.2f}")
    if spent.never:
        return QuotaExceeded(f"You exceeded your current quota: this request reserves {show(spent.asked)} (prompt + "
                             f"max new tokens x sequences{'' if line.measure == 'tokens' else ', at the model price'}"
                             f"), more than the {what}'s whole {name}. Lower max_tokens (or n / beams) or shorten "
                             "the prompt; retrying will not help.")
    held = f", {show(spent.in_flight)} held by requests in flight" if spent.in_flight else ""
    return QuotaExceeded(f"You exceeded your current quota: the {what}'s {name} has no room for this request "
                         f"({show(spent.settled)} used in {line.period_key}{held}; this request reserves "
                         f"{show(spent.asked)}). It resets at {iso(line.end)}, or when the operator raises it.")

