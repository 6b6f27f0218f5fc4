"""A budget in money as the dashboard's forms write it: an amount in dollars ("50" or "12.50"), a period (a UTC
month or day), whether it is hard, and where its alerts go (a webhook URL, e-mail addresses). Read strictly
(ASCII digits, at most six decimals, the model's own bounds) into auth/models.py's SpendBudget; where the alerts
may go is checked by the caller with gateway/serving/outbound.py's rule (`check_limits`), as the API does."""

from __future__ import annotations

import re
from decimal import Decimal

import msgspec
from litestar import Request

from auth.models import MAX_BUDGET_MICROS, Limits, SpendBudget
from gateway.serving.outbound import OutboundRule, check_limits

AMOUNT = re.compile(r"[0-9]{1,10}(\.[0-9]{1,6})?")
EMAIL_SPLIT = re.compile(r"[\s,;]+")
PERIODS = ("month", "day")
SPEND_FIELDS = ("spend_amount", "spend_period", "spend_hard", "spend_webhook", "spend_emails")
MAX_DOLLARS = MAX_BUDGET_MICROS // 1_000_000
AMOUNT_RULE = f"An amount in dollars such as 50 or 12.50 (digits 0-9, at most {MAX_DOLLARS:,}), or empty for none."
# the API's parameter names, as the forms' fields
FIELD_OF_PARAM = {"spend_budget.amount_micros": "spend_amount", "spend_budget.hard": "spend_hard",
                  "spend_budget": "spend_amount", "limits.spend_budget.webhook_url": "spend_webhook",
                  "limits.spend_budget.emails": "spend_emails"}


def spend_values(budget: SpendBudget | None) -> dict[str, str]:
    """A stored budget as the form's fields show it."""
    if budget is None:
        return {"spend_amount": "", "spend_period": "month", "spend_hard": "on", "spend_webhook": "",
                "spend_emails": ""}
    amount = Decimal(budget.amount_micros).scaleb(-6).normalize()
    return {"spend_amount": f"{amount:f}", "spend_period": budget.period, "spend_hard": "on" if budget.hard else "",
            "spend_webhook": budget.webhook_url or "", "spend_emails": ", ".join(budget.emails)}


def read_spend(form: dict, errors: dict[str, str]) -> SpendBudget | None:
    """The form's budget in money (None: the amount left empty); a problem goes into `errors` by field."""
    raw = str(form.get("spend_amount", "")).strip()
    period = str(form.get("spend_period") or "month")
    if period not in PERIODS:
        errors["spend_period"] = "Choose month or day."
    webhook = str(form.get("spend_webhook", "")).strip() or None
    emails = [e for e in EMAIL_SPLIT.split(str(form.get("spend_emails", ""))) if e]
    if not raw:
        if webhook or emails:
            errors["spend_amount"] = "Alerts need a budget: enter its amount."
        return None
    micros = int(Decimal(raw).scaleb(6)) if AMOUNT.fullmatch(raw) else 0
    if not 1 <= micros <= MAX_BUDGET_MICROS:
        errors["spend_amount"] = AMOUNT_RULE
        return None
    try:
        budget = msgspec.convert({"amount_micros": micros, "period": period, "hard": bool(form.get("spend_hard")),
                                  "webhook_url": webhook, "emails": emails}, SpendBudget)
    except msgspec.ValidationError as exc:
        field = "spend_webhook" if "webhook_url" in str(exc) else "spend_emails"
        errors[field] = ("An https:// URL with a host and no credentials, at most 2,000 characters."
                         if field == "spend_webhook" else "At most 10 e-mail addresses such as ops@example.com.")
        return None
    return None if "spend_period" in errors else budget


async def check_destinations(request: Request, limits: Limits | None, *, operator: bool) -> None:
    """BadRequest naming the field when the budget's alerts would go where the operator's rule refuses (the
    `[budget_alerts]` settings: public https hosts, allowed e-mail domains), as `check_limits` says for the API."""
    services = request.app.state.get("services")
    rule = OutboundRule.of(services.settings.budget_alerts) if services is not None else OutboundRule()
    await check_limits(limits, rule, operator=operator)
