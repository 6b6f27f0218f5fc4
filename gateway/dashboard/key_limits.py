"""What a key's limits say on the keys page: each by its kind. Rates and the monthly token budget are counts
("rpm 60", "tokens 1,000,000 a month"); a budget in money is an amount, its period and what happens once spent
("$50.00 a month, hard"), with the spend of its current period and the share used ("$58.50 spent (117 %)"), so
an owner sees a service key's budget and how far it went (the figures of `GET /v1/team/limits`, from
gateway/serving/spending.py's `limits_view`)."""

from __future__ import annotations

import msgspec
from markupsafe import Markup, escape

from auth.models import KeyRecord, Limits, SpendBudget
from gateway.dashboard.render import count, money, share
from gateway.serving.spending import BudgetView, SpendReader, limits_view

RATES = ("rpm", "tpm", "max_concurrency")
NONE_OF_ITS_OWN = "team's"


def scope_of(key: KeyRecord) -> str:
    return f"key:{key.id}"


async def budget_spend(gate: SpendReader | None, keys: list[KeyRecord]) -> dict[str, BudgetView]:
    """The spend of each key's budget in money in its current period, by scope ("key:<id>")."""
    scoped = [(scope_of(k), k.limits) for k in keys if k.limits is not None and k.limits.spend_budget is not None]
    if not scoped:
        return {}
    view = await limits_view(gate, "", scoped)
    return {b.scope: b for b in view.budgets}


def _budget(budget: SpendBudget, spent: BudgetView | None) -> Markup:
    said = Markup("{} a {}, {}").format(money(budget.amount_micros), budget.period,
                                        "hard" if budget.hard else "alerts only")
    if spent is None:
        return said
    return said + Markup(": {} spent ({})").format(money(spent.spent_micros),
                                                    share(spent.spent_micros / spent.amount_micros))


def limits_text(limits: Limits | None, spent: BudgetView | None = None) -> Markup:
    """The key's own limits, each by its kind, or "team's" when it has none of its own."""
    if limits is None:
        return Markup(NONE_OF_ITS_OWN)
    shown = [Markup("{} {}").format(name, count(getattr(limits, name)))
             for name in RATES if getattr(limits, name) is not None]
    if limits.monthly_token_budget is not None:
        shown.append(Markup("tokens {} a month").format(count(limits.monthly_token_budget)))
    if limits.spend_budget is not None:
        shown.append(_budget(limits.spend_budget, spent))
    return Markup(" · ").join(shown) if shown else escape(NONE_OF_ITS_OWN)


def said(name: str, value) -> Markup:
    """A value of an audit entry's detail as a reader reads it, never as Python prints it: limits as the keys page
    writes them, lists joined, objects as "name value" pairs, yes/no, "none"."""
    if name == "limits" and isinstance(value, dict):
        try:
            return limits_text(msgspec.convert(value, Limits))
        except (msgspec.ValidationError, TypeError):
            pass  # an older entry's shape: written out below
    if value is None:
        return Markup("none")
    if isinstance(value, bool):
        return Markup("yes" if value else "no")
    if isinstance(value, list | tuple):
        return Markup(", ").join(said(name, v) for v in value) if value else Markup("none")
    if isinstance(value, dict):
        return Markup(" · ").join(Markup("{} {}").format(k, said(k, v)) for k, v in value.items())
    return escape(str(value))
