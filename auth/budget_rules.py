"""Budgets within the operator's ceiling: what a team's owners may give their team and its keys.

The operator sets a team's `ceiling` (auth/models.py Ceiling, with `PATCH /admin/teams/{id}`); the team's owners
then set and raise, on their own, the team's budget in money and its monthly token budget (`PUT /v1/team/budgets`)
and each service key's (`PATCH /v1/team/keys/{id}`, the key forms), never above the ceiling. Where the ceiling
caps money, the team's budget must be a hard one: a budget that only alerts caps nothing. Without a ceiling the
team's budgets stay the operator's alone; a key's budget then needs no cap, the team's own still applies to it.
The operator (an admin key) is never capped: the ceiling is theirs to move."""

from __future__ import annotations

from auth.models import Ceiling, Limits, SpendBudget, TeamBudgets

NO_CEILING = ("The operator has set no ceiling on this team's budgets, so only the operator changes them; ask "
              "them to set one.")


def _dollars(micros: int) -> str:
    return f"${micros / 1_000_000:,.2f}"


def _spend_refusal(ceiling: Ceiling, budget: SpendBudget | None, *, team: bool) -> tuple[str, str] | None:
    cap = ceiling.spend_micros
    if cap is None:
        return None
    if budget is None:
        return ("spend_budget", f"The operator caps this team's spend at {_dollars(cap)} a period: set a budget in "
                "money of at most that.") if team else None
    if budget.amount_micros > cap:
        return ("spend_budget.amount_micros", f"A budget in money may be at most the operator's ceiling for this "
                f"team, {_dollars(cap)} ({cap:,} micro-units); {_dollars(budget.amount_micros)} is above it.")
    if team and not budget.hard:
        return "spend_budget.hard", ("The operator caps this team's spend, so its budget in money must be hard "
                                     "(requests refused once spent), not alerts only.")
    return None


def _tokens_refusal(ceiling: Ceiling, tokens: int | None, *, team: bool) -> tuple[str, str] | None:
    cap = ceiling.monthly_tokens
    if cap is None:
        return None
    if tokens is None:
        return ("monthly_token_budget", f"The operator caps this team at {cap:,} tokens a month: set a monthly "
                "token budget of at most that.") if team else None
    if tokens > cap:
        return ("monthly_token_budget", f"A monthly token budget may be at most the operator's ceiling for this "
                f"team, {cap:,}; {tokens:,} is above it.")
    return None


def team_budgets_refusal(ceiling: Ceiling | None, body: TeamBudgets) -> tuple[str, str] | None:
    """(field, why) when an owner may not give the team these budgets; None when they may."""
    if ceiling is None:
        return "ceiling", NO_CEILING
    return (_spend_refusal(ceiling, body.spend_budget, team=True)
            or _tokens_refusal(ceiling, body.monthly_token_budget, team=True))


def key_budgets_refusal(ceiling: Ceiling | None, limits: Limits | None) -> tuple[str, str] | None:
    """(field, why) when an owner may not give a key these budgets: each at most the team's ceiling."""
    if ceiling is None or limits is None:
        return None
    return (_spend_refusal(ceiling, limits.spend_budget, team=False)
            or _tokens_refusal(ceiling, limits.monthly_token_budget, team=False))


def team_only_on_key(limits: Limits | None) -> tuple[str, str] | None:
    """A ceiling and health alerts belong to a team: refused on a key, whoever sets them."""
    if limits is not None and limits.ceiling is not None:
        return "limits.ceiling", "A ceiling is set on a team (by the operator), never on a key."
    if limits is not None and limits.health_alerts is not None:
        return "limits.health_alerts", "Health alerts are a team's (PUT /v1/team/alerts), never a key's."
    return None


def with_budgets(limits: Limits | None, body: TeamBudgets) -> Limits:
    """The team's limits with the owners' budgets in place; its rates and the ceiling stay as they are."""
    base = limits or Limits()
    return Limits(rpm=base.rpm, tpm=base.tpm, max_concurrency=base.max_concurrency,
                  monthly_token_budget=body.monthly_token_budget, spend_budget=body.spend_budget,
                  ceiling=base.ceiling, health_alerts=base.health_alerts)
