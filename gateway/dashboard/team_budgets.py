"""The Limits page's owner forms: the team's budget in money and monthly token budget within the operator's
ceiling (as `PUT /v1/team/budgets`), and its alerts on error rate and p95 latency (as `PUT|DELETE
/v1/team/alerts`), through auth/team_budgets.py. A member gets 403; a bad or refused field is said at the field,
the form as typed."""

from __future__ import annotations

from urllib.parse import urlencode

import msgspec
from litestar import Request, Response, post
from litestar.response import Redirect

from auth.errors import RequestError
from auth.models import HealthAlerts, Limits, TeamBudgets
from auth.service import AuthService
from auth.sessions import SessionStore
from common.errors import BadRequest
from gateway.authentication.middleware import PUBLIC
from gateway.dashboard.access import BASE
from gateway.dashboard.budget_fields import EMAIL_SPLIT, FIELD_OF_PARAM, SPEND_FIELDS, check_destinations, read_spend
from gateway.dashboard.fields import ascii_whole
from gateway.dashboard.filters import zone_or_utc
from gateway.dashboard.key_grants import MAX_LIMIT
from gateway.dashboard.keys import _actor, _owner_form
from gateway.dashboard.limits import limits_template
from gateway.serving.outbound import OutboundRule, check_health_alerts
from gateway.serving.services import Services

TOKENS = "monthly_token_budget"


@post("/limits/budgets", opt=PUBLIC, status_code=303)
async def set_budgets(request: Request, sessions: SessionStore, auth: AuthService, services: Services) -> Response:
    session, scope, form = await _owner_form(request, sessions, auth)
    typed = {name: str(form.get(name, "")) for name in (*SPEND_FIELDS, TOKENS)}
    errors: dict[str, str] = {}
    spend = read_spend(typed, errors)
    tokens = None
    if typed[TOKENS].strip():
        tokens = ascii_whole(typed[TOKENS].strip())
        if tokens is None or tokens > MAX_LIMIT:
            errors[TOKENS] = f"A whole number from 0 to {MAX_LIMIT:,} in the digits 0-9, or empty for none."
    if not errors:
        try:
            await check_destinations(request, Limits(spend_budget=spend), operator=scope.is_admin)
            await auth.team_budgets.set(_actor(request, session, auth), scope.manager, scope.team.id,
                                        TeamBudgets(spend_budget=spend, monthly_token_budget=tokens))
        except (RequestError, BadRequest) as exc:
            errors[FIELD_OF_PARAM.get(exc.param or "", exc.param or "ceiling")] = exc.message
            return await limits_template(scope, session, auth, services, values=typed, errors=errors,
                                         status=exc.status)
    if errors:
        return await limits_template(scope, session, auth, services, values=typed, errors=errors, status=400)
    return _back_to_limits(request, scope.team.id)


ALERT_NUMBERS = ("error_rate_percent", "latency_p95_ms", "window_s", "min_requests")
ALERT_FIELDS = (*ALERT_NUMBERS, "alert_webhook", "alert_emails")
ALERT_PARAMS = {"webhook_url": "alert_webhook", "emails": "alert_emails"}


def read_alerts(typed: dict[str, str], errors: dict[str, str]) -> HealthAlerts | None:
    """The form's health alerts (None: both thresholds left empty, no alerts); a problem goes into `errors`."""
    numbers: dict[str, int] = {}
    for field in ALERT_NUMBERS:
        raw = typed[field].strip()
        if raw:
            value = ascii_whole(raw)
            if value is None:
                errors[field] = "A whole number in the digits 0-9, or empty."
            else:
                numbers[field] = value
    if errors or ("error_rate_percent" not in numbers and "latency_p95_ms" not in numbers):
        return None
    emails = [e for e in EMAIL_SPLIT.split(typed["alert_emails"]) if e]
    try:
        return msgspec.convert({**numbers, "webhook_url": typed["alert_webhook"].strip() or None, "emails": emails},
                               HealthAlerts)
    except msgspec.ValidationError as exc:
        said = str(exc)
        field = next((f for f in ALERT_NUMBERS if f in said), "alert_emails" if "emails" in said else "alert_webhook")
        errors[field] = said.split(" - at ")[0]
        return None


@post("/limits/alerts", opt=PUBLIC, status_code=303)
async def set_alerts(request: Request, sessions: SessionStore, auth: AuthService, services: Services) -> Response:
    """The team's alerts on its error rate and p95 latency, as `PUT|DELETE /v1/team/alerts` sets them."""
    session, scope, form = await _owner_form(request, sessions, auth)
    typed = {name: str(form.get(name, "")) for name in ALERT_FIELDS}
    errors: dict[str, str] = {}
    alerts = read_alerts(typed, errors)
    if not errors:
        try:
            rule = OutboundRule.of(services.settings.budget_alerts)
            await check_health_alerts(alerts, rule, operator=scope.is_admin)
            await auth.team_budgets.set_alerts(_actor(request, session, auth), scope.manager, scope.team.id, alerts)
        except (RequestError, BadRequest) as exc:
            errors[ALERT_PARAMS.get(exc.param or "", exc.param or "alert_webhook")] = exc.message
            return await limits_template(scope, session, auth, services, alert_values=typed, errors=errors,
                                         status=exc.status)
    if errors:
        return await limits_template(scope, session, auth, services, alert_values=typed, errors=errors, status=400)
    return _back_to_limits(request, scope.team.id)


def _back_to_limits(request: Request, team_id: str) -> Redirect:
    """The Limits page of the team again, in the zone it was seen in (post, redirect, get)."""
    tz = zone_or_utc(request.query_params)[0]
    return Redirect(f"{BASE}/limits?" + urlencode({"team_id": team_id, **({"tz": tz} if tz != "UTC" else {})}),
                    status_code=303)


BUDGET_HANDLERS = [set_budgets, set_alerts]
